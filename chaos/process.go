package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/bentoevents/bento/internal/tcpproxy"
)

// slot is one process of the campaign, restarted by its supervisor
// whenever it exits until the slot is stopped, with its own proxies to the
// database and the broker (nil where the stack has none).
type slot struct {
	name   string
	spec   childSpec
	db, mq *tcpproxy.Proxy
	args   []string // the test binary's arguments that rerun the campaign's test
	dir    string

	mu       sync.Mutex
	cmd      *exec.Cmd
	started  chan struct{} // closed and replaced at each start
	stopped  bool
	paused   bool
	starts   int
	done     chan struct{} // closed when the supervisor returns
	exitLogs []string
}

func newSlot(name string, spec childSpec, args []string, dir string) *slot {
	return &slot{name: name, spec: spec, args: args, dir: dir, started: make(chan struct{}), done: make(chan struct{})}
}

// supervise starts the slot's process and starts it again after each exit,
// until stop.
func (s *slot) supervise() {
	defer close(s.done)
	for {
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			return
		}
		s.starts++
		name := fmt.Sprintf("%s#%d", s.name, s.starts)
		spec, _ := json.Marshal(s.spec)
		cmd := exec.Command(s.args[0], s.args[1:]...)
		cmd.Env = append(os.Environ(), envChild+"="+string(spec), envInstance+"="+name)
		cmd.SysProcAttr = sysProcAttr()
		out, err := os.Create(filepath.Join(s.dir, name+".log"))
		if err == nil {
			cmd.Stdout, cmd.Stderr = out, out
			err = cmd.Start()
		}
		if err != nil {
			s.exitLogs = append(s.exitLogs, fmt.Sprintf("%s: start: %v", name, err))
			s.mu.Unlock()
			time.Sleep(time.Second)
			continue
		}
		s.cmd, s.paused = cmd, false
		close(s.started)
		s.started = make(chan struct{})
		s.mu.Unlock()

		err = cmd.Wait()
		_ = out.Close()
		s.mu.Lock()
		s.cmd = nil
		if err != nil && !s.stopped {
			s.exitLogs = append(s.exitLogs, fmt.Sprintf("%s: %v", name, err))
		}
		s.mu.Unlock()
		time.Sleep(200 * time.Millisecond) // a supervisor's restart delay
	}
}

// signal sends sig to the running process, if any, and reports whether
// there was one.
func (s *slot) signal(sig syscall.Signal) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return false
	}
	switch sig {
	case syscall.SIGSTOP:
		s.paused = true
	case syscall.SIGCONT, syscall.SIGKILL:
		s.paused = false
	}
	return s.cmd.Process.Signal(sig) == nil
}

// nextStart returns a channel closed when the process starts next.
func (s *slot) nextStart() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// stop ends the slot: no more restarts; the process gets SIGTERM (after
// SIGCONT, if paused) and SIGKILL if it has not exited within grace.
func (s *slot) stop(grace time.Duration) {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.signal(syscall.SIGCONT)
	s.signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(grace):
		s.signal(syscall.SIGKILL)
		<-s.done
	}
}

// heal undoes what faults left on the slot: it resumes a paused process
// and restores its links.
func (s *slot) heal() {
	s.mu.Lock()
	paused := s.paused
	s.mu.Unlock()
	if paused {
		s.signal(syscall.SIGCONT)
	}
	for _, p := range []*tcpproxy.Proxy{s.db, s.mq} {
		if p != nil {
			p.Restore()
			p.Resume()
			p.Slow(0)
		}
	}
}

// close closes the slot's proxies.
func (s *slot) close() {
	for _, p := range []*tcpproxy.Proxy{s.db, s.mq} {
		if p != nil {
			_ = p.Close()
		}
	}
}
