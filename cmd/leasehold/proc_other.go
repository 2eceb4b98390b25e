//go:build !unix

package main

import (
	"os"
	"os/exec"
)

func setProcessGroup(cmd *exec.Cmd) {}

// signalGroup signals only p itself: there are no process groups here.
func signalGroup(p *os.Process, sig os.Signal) error {
	if err := p.Signal(sig); err != nil {
		return p.Kill()
	}
	return nil
}
