package main

// Finding this process's memory cgroup and reading its limit, as the
// server did before it read the limit through automemlimit (gc.go): kept
// for the tests, which set up a real cgroup with it (cgroup_real_test.go)
// and check the library against it.

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// memCgroup is the memory cgroup of this process: dir is the directory of
// its cgroup, mount the mount point of the hierarchy it is in (dir or an
// ancestor of it), and v2 tells cgroup v2 (memory.max) from v1
// (memory.limit_in_bytes).
type memCgroup struct {
	dir, mount string
	v2         bool
}

// findMemCgroup finds this process's memory cgroup from fsRoot's
// /proc/self/cgroup and /proc/self/mountinfo (fsRoot is "" but in tests,
// which lay out a fake tree; the directories returned are under fsRoot).
// A cgroup v1 memory hierarchy is preferred to the v2 one: on a hybrid
// system the memory controller is attached to v1, and the v2 hierarchy has
// no memory files. ok is false when there is no memory cgroup (not Linux,
// or no hierarchy mounted).
func findMemCgroup(fsRoot string) (cg memCgroup, ok bool, err error) {
	v1Path, v2Path, has1, has2, err := procCgroups(filepath.Join(fsRoot, "/proc/self/cgroup"))
	if err != nil || (!has1 && !has2) {
		return memCgroup{}, false, err
	}
	mounts, err := cgroupMounts(filepath.Join(fsRoot, "/proc/self/mountinfo"))
	if err != nil {
		return memCgroup{}, false, err
	}
	for _, want := range []bool{false, true} { // v1 first, then v2
		p, has := v1Path, has1
		if want {
			p, has = v2Path, has2
		}
		if !has {
			continue
		}
		for _, m := range mounts {
			if m.v2 != want {
				continue
			}
			rel := cgroupRel(p, m.root)
			return memCgroup{
				dir:   filepath.Join(fsRoot, m.point, filepath.FromSlash(rel)),
				mount: filepath.Join(fsRoot, m.point),
				v2:    m.v2,
			}, true, nil
		}
	}
	return memCgroup{}, false, nil
}

// procCgroups reads a /proc/PID/cgroup file: the path of the v1 hierarchy
// with the memory controller and the path in the v2 hierarchy ("0::/path").
func procCgroups(file string) (v1, v2 string, has1, has2 bool, err error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return "", "", false, false, nil
	}
	if err != nil {
		return "", "", false, false, err
	}
	for line := range strings.Lines(string(b)) {
		f := strings.SplitN(strings.TrimRight(line, "\n"), ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			v2, has2 = f[2], true
			continue
		}
		for c := range strings.SplitSeq(f[1], ",") {
			if c == "memory" && !has1 {
				v1, has1 = f[2], true
			}
		}
	}
	return v1, v2, has1, has2, nil
}

// cgroupMount is a mounted cgroup hierarchy: a cgroup2 one, or a v1 one
// with the memory controller.
type cgroupMount struct {
	root, point string // the cgroup mounted, and where
	v2          bool
}

// cgroupMounts reads a /proc/PID/mountinfo file for the cgroup2 mounts
// and the cgroup v1 mounts of the memory controller, in file order.
func cgroupMounts(file string) ([]cgroupMount, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []cgroupMount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// ID parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(sc.Text())
		sep := -1
		for i := 6; i < len(fields); i++ {
			if fields[i] == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		m := cgroupMount{root: unescapeMountinfo(fields[3]), point: unescapeMountinfo(fields[4])}
		switch fields[sep+1] {
		case "cgroup2":
			m.v2 = true
		case "cgroup":
			if sep+3 >= len(fields) || !hasOption(fields[sep+3], "memory") {
				continue
			}
		default:
			continue
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

func hasOption(opts, name string) bool {
	for o := range strings.SplitSeq(opts, ",") {
		if o == name {
			return true
		}
	}
	return false
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space,
// \011, \012, \134).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// cgroupRel is the directory of cgroup p relative to a mount of cgroup
// root. A cgroup outside the mounted one (a process in another cgroup
// namespace) is read at the mount point itself.
func cgroupRel(p, root string) string {
	p, root = path.Clean("/"+p), path.Clean("/"+root)
	switch {
	case root == "/":
		return p
	case p == root:
		return "/"
	case strings.HasPrefix(p, root+"/"):
		return strings.TrimPrefix(p, root)
	}
	return "/"
}

// memLimit returns the memory limit of the cgroup: the smallest limit of
// its directory and its ancestors up to the mount point (a parent's limit
// bounds its children), or 0 when none is set ("max" in v2, "unlimited"
// in v1). Directories without the limit file (the root cgroup) are
// skipped.
func (cg memCgroup) memLimit() (int64, error) {
	name := "memory.limit_in_bytes"
	if cg.v2 {
		name = "memory.max"
	}
	var limit int64
	for dir := cg.dir; ; dir = filepath.Dir(dir) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return 0, err
		default:
			n, err := parseCgroupMem(string(b))
			if err != nil {
				return 0, fmt.Errorf("%s: %w", filepath.Join(dir, name), err)
			}
			if n > 0 && (limit == 0 || n < limit) {
				limit = n
			}
		}
		if dir == cg.mount || !strings.HasPrefix(dir, cg.mount+string(filepath.Separator)) {
			return limit, nil
		}
	}
}

// parseCgroupMem parses a memory.max or memory.limit_in_bytes value: 0 for
// no limit.
func parseCgroupMem(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("memory limit %q: %w", s, err)
	}
	if n <= 0 || n >= unlimitedCgroupMem {
		return 0, nil
	}
	return n, nil
}

// cgroupMemLimit is the memory limit of this process's cgroup (see
// findMemCgroup and memLimit), 0 when there is none.
func cgroupMemLimit(fsRoot string) (int64, error) {
	cg, ok, err := findMemCgroup(fsRoot)
	if err != nil || !ok {
		return 0, err
	}
	return cg.memLimit()
}
