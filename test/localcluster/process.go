package localcluster

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// Process is a child process: etcd, a kube-apiserver, or (in end-to-end
// tests) a relaymesh server or agent.
type Process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited (attached mode)
	err  error         // exit status, valid after done
	log  string        // path of its combined output
}

// StartProcess runs bin with args, output to logPath. Attached processes are
// killed by the kernel if this Go process dies (Pdeathsig), so a crashed or
// timed-out test leaves nothing behind. Detached ones (for `up`) get their own
// session and outlive the command that started them.
func StartProcess(name, bin string, args []string, logPath string, detach bool) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open log for %s: %w", name, err)
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if detach {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	p := &Process{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Exited reports whether the process is gone, and how it ended.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop asks the process group to terminate, then kills it after grace.
func (p *Process) Stop(grace time.Duration) error {
	if done, _ := p.Exited(); done {
		return nil
	}
	pid := p.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, pid)
	}
}

// killGroup terminates a detached process group by pid (used by `down`,
// which did not start the process itself).
func killGroup(pid int, grace time.Duration) error {
	if pid <= 1 {
		return fmt.Errorf("refusing to signal pid %d", pid)
	}
	if err := syscall.Kill(-pid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return fmt.Errorf("signal process group %d: %w", pid, err)
	}
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !Alive(pid) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill process group %d: %w", pid, err)
	}
	return nil
}

// Alive reports whether a process with this pid exists (and is not a zombie
// we are about to reap).
func Alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// FreePort asks the kernel for an unused port of 127.0.0.1. Another process
// can take it before the process it is for binds it, so it is only for a
// start that is retried when that happens (istiod in test/istiod,
// relaymesh servers whose certificate names 127.0.0.1 in test/fleet).
// Processes a test starts otherwise listen on ListenAddr (etcd and the API
// servers here on an environment's own address); the demo's dashboard and
// metrics ports, which a person opens, are on 127.0.0.1.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, fmt.Errorf("unexpected listener address %v", l.Addr())
	}
	return addr.Port, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// LogPath is the file holding the process's output.
func (p *Process) LogPath() string { return p.log }

// BuildRelaymesh compiles cmd/relaymesh of this repository into dir and
// returns the binary's path, for tests and the demo that run it as a process.
func BuildRelaymesh(dir string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "relaymesh")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/relaymesh")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build relaymesh: %w\n%s", err, out)
	}
	return bin, nil
}

// Kill ends the process group at once with SIGKILL, as a crash would, and
// waits for the process to exit.
func (p *Process) Kill() error {
	if done, _ := p.Exited(); done {
		return nil
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}
