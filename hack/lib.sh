# Shared by hack/tools.sh and hack/demo.sh (sourced, not run).

# quiet_go TAG GO-ARGS...: run `go GO-ARGS...` without its `go: downloading`
# lines: they are counted and summed up in one line ("TAG: N Go modules
# downloaded"). Every other line of go's stderr, errors above all, is passed
# through as it comes. Returns go's exit status.
quiet_go() {
  local tag=$1
  shift
  local rc=0
  # go's stdout goes to fd 3 (the caller's stdout); only its stderr is
  # filtered. `|| true` keeps a caller's errexit from ending the group before
  # go's status is read.
  {
    go "$@" 2>&1 1>&3 3>&- | awk -v tag="$tag" '
      /^go: downloading / { n++; next }
      { print > "/dev/stderr"; fflush("/dev/stderr") }
      END { if (n) printf "%s: %d Go modules downloaded\n", tag, n }'
    rc=${PIPESTATUS[0]}
  } 3>&1 || true
  return "$rc"
}

# clock SECONDS -> M:SS
clock() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }
