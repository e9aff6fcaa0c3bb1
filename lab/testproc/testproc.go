// Package testproc starts the processes of the test servers' helpers
// (testredis, testetcd, testzk) the same way: output to the helper's own
// writer and, when asked, appended to a log file; optionally in a process
// group of their own; waited for by a goroutine that closes the log.
package testproc

import (
	"io"
	"os"
	"os/exec"
	"syscall"
)

// Start starts cmd with its output going to out and, when logFile is set,
// appended to that file too; ownGroup starts it in a process group of its
// own (a Ctrl-C of the terminal then reaches only the program that
// started it, which stops its servers itself). The returned channel closes
// once the process has exited and its output is copied.
func Start(cmd *exec.Cmd, out io.Writer, logFile string, ownGroup bool) (exited <-chan struct{}, err error) {
	cmd.Stdout, cmd.Stderr = out, out
	var log *os.File
	if logFile != "" {
		f, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		log = f
		w := io.MultiWriter(out, lenient{f})
		cmd.Stdout, cmd.Stderr = w, w
	}
	if ownGroup {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := cmd.Start(); err != nil {
		if log != nil {
			_ = log.Close()
		}
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait() // returns once the output is copied
		if log != nil {
			_ = log.Close()
		}
		close(done)
	}()
	return done, nil
}

// lenient writes to a log file and ignores its errors, so that a full disk
// never stops the copying of a server's output (which would block the
// server on its pipe).
type lenient struct{ w io.Writer }

func (l lenient) Write(p []byte) (int, error) {
	_, _ = l.w.Write(p)
	return len(p), nil
}
