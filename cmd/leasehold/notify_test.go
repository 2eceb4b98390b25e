package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listenNotify opens a unixgram socket like systemd's notify socket.
func listenNotify(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readNotify returns the next datagram, waiting up to 30 s.
func readNotify(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no notify message: %v", err)
	}
	return string(buf[:n])
}

func TestSdNotify(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify.sock")
	abstract := "@leasehold-test-" + randomID(8)
	for _, name := range []string{path, abstract} {
		c := listenNotify(t, name)
		if err := sdNotify(name, "READY=1"); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := readNotify(t, c); got != "READY=1" {
			t.Errorf("%s: got %q", name, got)
		}
	}
	if err := sdNotify("vsock:2:1", "READY=1"); err == nil {
		t.Error("vsock: want an error")
	}
	// No NOTIFY_SOCKET: nothing is sent, nothing fails.
	a, _, _ := testApp(nil)
	a.newNotifier(slog.New(slog.NewTextHandler(io.Discard, nil))).send("READY=1")
}

func TestNotifyWhenReady(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify.sock")
	c := listenNotify(t, path)
	a, _, _ := testApp(map[string]string{"NOTIFY_SOCKET": path})
	n := a.newNotifier(slog.New(slog.NewTextHandler(io.Discard, nil)))
	first := make(chan struct{})
	calls := 0
	ready := func() error {
		calls++
		if calls < 3 {
			return errors.New("applying the log")
		}
		return nil
	}
	done := make(chan bool, 1)
	go func() { done <- n.notifyWhenReady(context.Background(), first, ready, time.Millisecond) }()
	if got := readNotify(t, c); got != "STATUS=waiting for a leader" {
		t.Errorf("first message %q", got)
	}
	close(first)
	if got := readNotify(t, c); got != "STATUS=not ready: applying the log" {
		t.Errorf("second message %q", got)
	}
	// The same reason twice is sent once.
	if got := readNotify(t, c); !strings.HasPrefix(got, "READY=1\n") {
		t.Errorf("third message %q", got)
	}
	if !<-done || calls != 3 {
		t.Errorf("calls %d", calls)
	}

	// Cancelled before ready: no READY=1.
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- n.notifyWhenReady(ctx, make(chan struct{}), ready, time.Millisecond) }()
	readNotify(t, c) // STATUS=waiting
	cancel()
	if <-done {
		t.Error("reported ready after cancel")
	}
}

// TestProcessSystemdNotify runs a server with NOTIFY_SOCKET set, as systemd
// does for Type=notify: READY=1 arrives once /readyz answers 200, and
// STOPPING=1 on SIGTERM.
func TestProcessSystemdNotify(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify.sock")
	c := listenNotify(t, path)
	t.Setenv("NOTIFY_SOCKET", path)
	s := newServer(t)
	s.launch()
	var msgs []string
	for i := 0; i < 100; i++ {
		m := readNotify(t, c)
		msgs = append(msgs, m)
		if strings.HasPrefix(m, "READY=1") {
			break
		}
	}
	if !strings.HasPrefix(msgs[len(msgs)-1], "READY=1") {
		t.Fatalf("no READY=1 in %q", msgs)
	}
	resp, err := http.Get("http://" + s.http + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("READY=1 sent while /readyz answers %d", resp.StatusCode)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	if got := readNotify(t, c); got != "STOPPING=1" {
		t.Errorf("on SIGTERM: %q", got)
	}
}
