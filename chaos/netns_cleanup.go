//go:build linux

package chaos

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Every run records itself in a state file under netnsStateDir, written
// under an exclusive lock before it creates anything: its name prefix, the
// subnet it took and its owner (pid and start time). Cleanup removes what
// belongs to runs whose owner is gone, and anything named lhc... that no
// state file claims; it never touches a live run of another process.
var netnsStateDir = "/run/leasehold-chaos"

type runState struct {
	Prefix     string `json:"prefix"`
	Subnet     int    `json:"subnet"`
	OwnerPID   int    `json:"owner_pid"`
	OwnerStart string `json:"owner_start"`
}

func randomRunID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 6)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// procStart is the start time (in clock ticks since boot) of pid, "" if it
// does not exist: pid plus start time identifies a process across pid reuse.
func procStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	if k := strings.LastIndexByte(s, ')'); k >= 0 {
		f := strings.Fields(s[k+1:])
		if len(f) > 19 {
			return f[19] // field 22: starttime
		}
	}
	return ""
}

func (s runState) ownerAlive() bool {
	return s.OwnerPID > 0 && procStart(s.OwnerPID) == s.OwnerStart
}

// lockState takes the state directory's exclusive lock (bounded by 30 s).
func lockState() (unlock func(), err error) {
	if err := os.MkdirAll(netnsStateDir, 0o700); err != nil {
		return nil, fmt.Errorf("chaos: state dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(netnsStateDir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("chaos: state lock: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("chaos: state lock: %w", err)
		}
		<-time.After(20 * time.Millisecond)
	}
}

// readStates reads every run's state file.
func readStates() (map[string]runState, error) {
	ents, err := os.ReadDir(netnsStateDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	out := map[string]runState{}
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, netnsPrefix) || !strings.HasSuffix(name, ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(netnsStateDir, name))
		if err != nil {
			continue
		}
		var s runState
		if json.Unmarshal(b, &s) != nil || s.Prefix+".json" != name {
			// Unreadable (a crash mid-write): its owner is gone or
			// will fail; treat it as dead.
			s = runState{Prefix: strings.TrimSuffix(name, ".json")}
		}
		out[s.Prefix] = s
	}
	return out, nil
}

// claimRun records a new run with the given prefix and picks a free
// 10.77.K.0/24 for it: none of another run's, and none the root namespace
// has an address or route in.
func claimRun(prefix string) (path string, subnet int, err error) {
	unlock, err := lockState()
	if err != nil {
		return "", 0, err
	}
	defer unlock()
	states, err := readStates()
	if err != nil {
		return "", 0, err
	}
	if s, ok := states[prefix]; ok && s.ownerAlive() {
		return "", 0, fmt.Errorf("chaos: run %s is in use by pid %d", prefix, s.OwnerPID)
	}
	used := map[int]bool{}
	for _, s := range states {
		used[s.Subnet] = true
	}
	routes, err := output(context.Background(), nil, "ip", "-4", "route", "show", "table", "all")
	if err != nil {
		return "", 0, err
	}
	addrs, err := output(context.Background(), nil, "ip", "-4", "-o", "addr", "show")
	if err != nil {
		return "", 0, err
	}
	taken := routes + "\n" + addrs
	if strings.Contains(taken, "10.77.0.0/16") {
		return "", 0, errors.New("chaos: the root namespace routes 10.77.0.0/16 already; no subnet for the netns cluster")
	}
	h := fnv.New32a()
	h.Write([]byte(prefix))
	start := int(h.Sum32() % 250)
	for k := range 250 {
		cand := (start+k)%250 + 1
		if used[cand] || strings.Contains(taken, fmt.Sprintf("10.77.%d.", cand)) {
			continue
		}
		s := runState{Prefix: prefix, Subnet: cand, OwnerPID: os.Getpid(), OwnerStart: procStart(os.Getpid())}
		b, _ := json.Marshal(s)
		path = filepath.Join(netnsStateDir, prefix+".json")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return "", 0, fmt.Errorf("chaos: state file: %w", err)
		}
		return path, cand, nil
	}
	return "", 0, errors.New("chaos: no free subnet in 10.77.0.0/16")
}

var (
	nsNameRe   = regexp.MustCompile(`^(lhc[a-z0-9]{1,8})(hub|n[0-9])$`)
	linkNameRe = regexp.MustCompile(`^(lhc[a-z0-9]{1,8})h$`)
)

// runNamespaces lists the namespaces under /run/netns that belong to a run,
// by run prefix.
func runNamespaces() (map[string][]string, error) {
	ents, err := os.ReadDir("/run/netns")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	out := map[string][]string{}
	for _, e := range ents {
		if m := nsNameRe.FindStringSubmatch(e.Name()); m != nil {
			out[m[1]] = append(out[m[1]], e.Name())
		}
	}
	return out, nil
}

// runLinks lists the root namespace's links that belong to a run.
func runLinks(ctx context.Context) (map[string]string, error) {
	ents, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range ents {
		if m := linkNameRe.FindStringSubmatch(e.Name()); m != nil {
			out[m[1]] = e.Name()
		}
	}
	return out, nil
}

// removeRun kills every process inside the run's namespaces, deletes its
// nftables tables, namespaces and root link, and waits (bounded by ctx and
// 10 s) until the link is gone.
func removeRun(ctx context.Context, prefix string, _ int) error {
	nss, err := runNamespaces()
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range nss[prefix] {
		// Anything running inside a namespace of ours is ours.
		if out, err := output(ctx, nil, "ip", "netns", "pids", ns); err == nil {
			for _, f := range strings.Fields(out) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
					syscall.Kill(pid, syscall.SIGCONT)
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		if strings.HasSuffix(ns, "hub") {
			continue
		}
		// The table goes with the namespace; deleting it first makes
		// Close's account explicit. It may not exist.
		run(ctx, strings.NewReader("table inet "+prefix+"\ndelete table inet "+prefix+"\n"), "ip", "netns", "exec", ns, "nft", "-f", "-")
	}
	for _, ns := range nss[prefix] {
		if err := run(ctx, nil, "ip", "netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	link := prefix + "h"
	if _, err := os.Stat("/sys/class/net/" + link); err == nil {
		if err := run(ctx, nil, "ip", "link", "del", link); err != nil {
			// Deleting the hub namespace may have taken it already.
			if _, serr := os.Stat("/sys/class/net/" + link); serr == nil {
				errs = append(errs, err)
			}
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat("/sys/class/net/" + link); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			errs = append(errs, fmt.Errorf("chaos: link %s still present", link))
			break
		}
		<-time.After(20 * time.Millisecond)
	}
	return errors.Join(errs...)
}

// Cleanup removes what earlier netns runs left behind: for every run whose
// owning process is gone, and for anything named lhc<run>... that no state
// file claims, it kills the processes inside its namespaces and deletes the
// namespaces, the harness link, the nftables tables and the state file.
// Runs whose owner is alive (another test or runner on this machine) are
// left alone. NewNetnsCluster calls it first.
func Cleanup(ctx context.Context, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	unlock, err := lockState()
	if err != nil {
		return err
	}
	defer unlock()
	states, err := readStates()
	if err != nil {
		return err
	}
	nss, err := runNamespaces()
	if err != nil {
		return err
	}
	links, err := runLinks(ctx)
	if err != nil {
		return err
	}
	dead := map[string]bool{}
	for p, s := range states {
		if !s.ownerAlive() {
			dead[p] = true
		}
	}
	for p := range nss {
		if _, ok := states[p]; !ok {
			dead[p] = true
		}
	}
	for p := range links {
		if _, ok := states[p]; !ok {
			dead[p] = true
		}
	}
	var errs []error
	for p := range dead {
		log.Info("removing leftovers of an earlier chaos run", "prefix", p, "namespaces", len(nss[p]))
		if err := removeRun(ctx, p, 0); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Remove(filepath.Join(netnsStateDir, p+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
