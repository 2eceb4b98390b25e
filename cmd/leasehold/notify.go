package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"
)

// notifier speaks systemd's readiness protocol (sd_notify(3)): datagrams
// such as "READY=1" on the unix datagram socket $NOTIFY_SOCKET names, which
// the service manager sets for a unit with Type=notify. A name starting with
// '@' is an abstract socket (Go's net package maps it). Without the
// variable every call does nothing.
type notifier struct {
	socket string
	log    *slog.Logger
}

func (a *app) newNotifier(log *slog.Logger) *notifier {
	s, _ := a.lookupEnv("NOTIFY_SOCKET")
	return &notifier{socket: s, log: log}
}

// send sends one state message; a failure is logged, never fatal (the
// service manager then times the start out, which says more).
func (n *notifier) send(state string) {
	if n.socket == "" {
		return
	}
	if err := sdNotify(n.socket, state); err != nil {
		n.log.Warn("sd_notify", "state", strings.SplitN(state, "\n", 2)[0], "err", err)
	}
}

func sdNotify(socket, state string) error {
	if !strings.HasPrefix(socket, "/") && !strings.HasPrefix(socket, "@") {
		return fmt.Errorf("NOTIFY_SOCKET %q: only unix socket paths and @abstract names are supported", socket)
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err = conn.Write([]byte(state))
	return err
}

// notifyWhenReady waits until ready() is nil (what /readyz answers 200 to),
// polling every interval, and then sends READY=1. Until then it reports
// why not as STATUS= whenever the reason changes. It returns when ctx ends
// first, having sent nothing more.
func (n *notifier) notifyWhenReady(ctx context.Context, first <-chan struct{}, ready func() error, interval time.Duration) bool {
	last := ""
	status := func(s string) {
		if s != last {
			n.send("STATUS=" + s)
			last = s
		}
	}
	status("waiting for a leader")
	select {
	case <-first:
	case <-ctx.Done():
		return false
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		err := ready()
		if err == nil {
			n.send("READY=1\nSTATUS=ready: leader known and log applied")
			return true
		}
		status("not ready: " + err.Error())
		select {
		case <-t.C:
		case <-ctx.Done():
			return false
		}
	}
}
