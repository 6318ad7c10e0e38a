package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/relaymesh/relaymesh/test/localcluster"
)

// BinaryEnv names the environment variable that gives the relaymesh binary
// under test.
const BinaryEnv = "RELAYMESH_BIN"

// ResolveBinary returns the relaymesh binary to measure: path if set, else
// $RELAYMESH_BIN, else one built from this checkout into dir.
func ResolveBinary(path, dir string) (string, error) {
	if path == "" {
		path = os.Getenv(BinaryEnv)
	}
	if path == "" {
		return localcluster.BuildRelaymesh(dir)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	st, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("relaymesh binary: %w", err)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("relaymesh binary %s is not an executable file", abs)
	}
	return abs, nil
}

// ServerConfig says how to run one `relaymesh server`.
type ServerConfig struct {
	// Binary is the relaymesh binary. Required.
	Binary string
	// Kubeconfig of the management cluster. Required.
	Kubeconfig string
	// Namespace of the server; default relaymesh.
	Namespace string
	// Dir receives the log (<Name>.log) and audit log (<Name>-audit.log).
	// Required.
	Dir string
	// Name of the process in logs; default server.
	Name string
	// LogLevel; default info.
	LogLevel string
	// Args are extra flags.
	Args []string
	// Env is extra environment (KEY=VALUE), e.g. for a profiling build.
	Env []string
	// ReadyTimeout bounds the start; default 60s.
	ReadyTimeout time.Duration
}

// Server is a running `relaymesh server` process.
type Server struct {
	// Addr is the relay gRPC address (127.0.0.1:port); OpsAddr serves
	// /metrics, /healthz and /debug.
	Addr, OpsAddr string
	cfg           ServerConfig
	proc          *localcluster.Process
	audit         string
}

// StartServer starts a server on free loopback ports and waits until its
// relay port accepts connections. A port taken between choosing and binding
// it makes the server exit; it is tried again on fresh ports (three times).
func StartServer(ctx context.Context, cfg ServerConfig) (*Server, error) {
	if cfg.Binary == "" || cfg.Kubeconfig == "" || cfg.Dir == "" {
		return nil, errors.New("fleet server: binary, kubeconfig and dir are required")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "relaymesh"
	}
	if cfg.Name == "" {
		cfg.Name = "server"
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "info"
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 60 * time.Second
	}
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		p1, err := localcluster.FreePort()
		if err != nil {
			return nil, err
		}
		p2, err := localcluster.FreePort()
		if err != nil {
			return nil, err
		}
		s := &Server{
			Addr: "127.0.0.1:" + strconv.Itoa(p1), OpsAddr: "127.0.0.1:" + strconv.Itoa(p2), cfg: cfg,
			audit: filepath.Join(cfg.Dir, cfg.Name+"-audit.log"),
		}
		args := append([]string{"server", "--kubeconfig", cfg.Kubeconfig, "--namespace", cfg.Namespace,
			"--listen", s.Addr, "--metrics-listen", s.OpsAddr, "--metrics-plain-http", "--audit-log", s.audit, "--log-level", cfg.LogLevel}, cfg.Args...)
		s.proc, err = startProcess(cfg.Name, cfg.Binary, args, filepath.Join(cfg.Dir, cfg.Name+".log"), cfg.Env)
		if err != nil {
			return nil, err
		}
		if last = s.waitReady(ctx, cfg.ReadyTimeout); last == nil {
			return s, nil
		}
		_ = s.proc.Stop(5 * time.Second)
	}
	return nil, fmt.Errorf("relaymesh server did not start (see %s): %w", filepath.Join(cfg.Dir, cfg.Name+".log"), last)
}

// startProcess is localcluster.StartProcess with extra environment.
func startProcess(name, bin string, args []string, logPath string, env []string) (*localcluster.Process, error) {
	if len(env) == 0 {
		return localcluster.StartProcess(name, bin, args, logPath, false)
	}
	// localcluster.StartProcess takes the environment of this process;
	// set the extra variables for the child through a wrapper that execs it.
	// env execs bin, so the process keeps its pid.
	wrapped := append(append([]string{}, env...), bin)
	wrapped = append(wrapped, args...)
	envBin, err := exec.LookPath("env")
	if err != nil {
		return nil, err
	}
	return localcluster.StartProcess(name, envBin, wrapped, logPath, false)
}

func (s *Server) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if done, err := s.proc.Exited(); done {
			return fmt.Errorf("exited: %v", err)
		}
		if c, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not listening on %s after %s", s.Addr, timeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Pid is the server's process id.
func (s *Server) Pid() int { return s.proc.Pid() }

// LogPath is the file holding the server's output; AuditPath its audit log.
func (s *Server) LogPath() string   { return s.proc.LogPath() }
func (s *Server) AuditPath() string { return s.audit }

// Usage reads the server's CPU, RSS and thread count from /proc.
func (s *Server) Usage() (ProcUsage, error) { return ReadProc(s.Pid()) }

// Metrics scrapes the server's /metrics.
func (s *Server) Metrics(ctx context.Context) (Metrics, error) {
	return Scrape(ctx, &http.Client{Timeout: 10 * time.Second}, "http://"+s.OpsAddr+"/metrics")
}

// Stop ends the server (SIGTERM, then SIGKILL after 10 s); Kill ends it at
// once with SIGKILL, as a crash would.
func (s *Server) Stop() error { return s.proc.Stop(10 * time.Second) }
func (s *Server) Kill() error { return s.proc.Kill() }

// LogLine is one line of the server's JSON log.
type LogLine struct {
	Time  time.Time
	Level string
	Msg   string
	// Attrs holds every other field.
	Attrs map[string]any
}

// maxLogLine bounds one line read from the server's log.
const maxLogLine = 1 << 20

// ReadLog returns the lines of a JSON log file written after since (zero:
// all) that keep returns true for (nil: all). Lines that are not JSON are
// returned with Level "" and Msg holding the text.
func ReadLog(path string, since time.Time, keep func(LogLine) bool) ([]LogLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []LogLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), maxLogLine)
	for sc.Scan() {
		var raw map[string]any
		var l LogLine
		if err := json.Unmarshal(sc.Bytes(), &raw); err != nil {
			l = parseKlog(sc.Text(), since)
		} else {
			l.Level, _ = raw["level"].(string)
			l.Msg, _ = raw["msg"].(string)
			if ts, ok := raw["time"].(string); ok {
				l.Time, _ = time.Parse(time.RFC3339Nano, ts)
			}
			delete(raw, "level")
			delete(raw, "msg")
			delete(raw, "time")
			l.Attrs = raw
		}
		if !since.IsZero() && !l.Time.IsZero() && l.Time.Before(since) {
			continue
		}
		if keep == nil || keep(l) {
			out = append(out, l)
		}
	}
	return out, sc.Err()
}

// klogLine is a line client-go writes through klog, e.g.
// `I1125 05:32:19.133353   19980 request.go:752] "Waited before sending request" delay="10.8s" verb="GET"`.
var klogLine = regexp.MustCompile(`^([IWEF])(\d{2})(\d{2}) (\d{2}:\d{2}:\d{2}\.\d+)\s+\d+ [^\]]+\] "((?:[^"\\]|\\.)*)"(.*)$`)

// klogAttr is one key="value" of a klog line.
var klogAttr = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// parseKlog reads a klog line (level, time, message and key="value"
// attributes; klog's header has no year: the year of ref, or of now, is
// assumed); any other text becomes a line with that text as its message.
func parseKlog(text string, ref time.Time) LogLine {
	m := klogLine.FindStringSubmatch(text)
	if m == nil {
		return LogLine{Msg: text}
	}
	levels := map[string]string{"I": "INFO", "W": "WARN", "E": "ERROR", "F": "FATAL"}
	l := LogLine{Level: "klog-" + levels[m[1]], Msg: m[5], Attrs: map[string]any{}}
	if ref.IsZero() {
		ref = time.Now()
	}
	if t, err := time.ParseInLocation("2006-01-02 15:04:05.999999", fmt.Sprintf("%d-%s-%s %s", ref.Year(), m[2], m[3], m[4]), time.Local); err == nil {
		l.Time = t
	}
	for _, kv := range klogAttr.FindAllStringSubmatch(m[6], -1) {
		l.Attrs[kv[1]] = kv[2]
	}
	return l
}

// Throttled summarises client-go's "Waited before sending request" lines
// (client-side rate limiting of the server's Kubernetes client; client-go
// logs at most one such line every few seconds, for waits over a second).
type Throttled struct {
	Lines    int
	MaxDelay time.Duration
	// ByVerb counts the lines by HTTP verb.
	ByVerb map[string]int
}

// ThrottledOf reads the throttling lines among lines.
func ThrottledOf(lines []LogLine) Throttled {
	t := Throttled{ByVerb: map[string]int{}}
	for _, l := range lines {
		if l.Msg != "Waited before sending request" {
			continue
		}
		t.Lines++
		verb, _ := l.Attrs["verb"].(string)
		t.ByVerb[verb]++
		if d, err := time.ParseDuration(fmt.Sprint(l.Attrs["delay"])); err == nil {
			t.MaxDelay = max(t.MaxDelay, d)
		}
	}
	return t
}

// LogCounts counts log lines by "LEVEL msg".
func LogCounts(lines []LogLine) map[string]int {
	out := map[string]int{}
	for _, l := range lines {
		out[strings.TrimSpace(l.Level+" "+l.Msg)]++
	}
	return out
}
