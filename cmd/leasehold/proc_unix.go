//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// setProcessGroup makes cmd the leader of a new process group, so that
// everything it starts can be signalled at once.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// signalGroup sends sig to p's process group. A group that is already gone
// is not an error.
func signalGroup(p *os.Process, sig os.Signal) error {
	if p == nil || p.Pid <= 1 {
		// kill(0) would signal hold's own group and kill(-1) everything.
		return fmt.Errorf("refusing to signal process group of pid %v", p)
	}
	s, ok := sig.(syscall.Signal)
	if !ok {
		return p.Signal(sig)
	}
	if err := syscall.Kill(-p.Pid, s); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}
