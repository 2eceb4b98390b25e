package main

import (
	"os"
	"path/filepath"
	"testing"
)

// fakeTree lays out files (paths relative to the tree, contents) under a
// temporary directory and returns it.
func fakeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, body := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const (
	mountinfoV2 = "24 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
	// A hybrid host: memory on v1, the unified hierarchy without it.
	mountinfoHybrid = "30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n" +
		"31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:10 - cgroup cgroup rw,cpu,cpuacct\n" +
		"34 30 0:31 / /sys/fs/cgroup/memory rw,relatime shared:13 - cgroup cgroup rw,memory\n" +
		"40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)

// TestCgroupMemLimitFakeTrees: the memory limit is read from the cgroup
// that /proc/self/cgroup names, in the hierarchy /proc/self/mountinfo says
// is mounted where, for cgroup v2, v1 and hybrid layouts.
func TestCgroupMemLimitFakeTrees(t *testing.T) {
	for _, tt := range []struct {
		name    string
		files   map[string]string
		want    int64
		wantErr bool
	}{
		{
			name: "v2 container with its own cgroup namespace",
			files: map[string]string{
				"proc/self/cgroup":           "0::/\n",
				"proc/self/mountinfo":        mountinfoV2,
				"sys/fs/cgroup/memory.max":   "536870912\n",
				"sys/fs/cgroup/cgroup.procs": "1\n",
			},
			want: 512 << 20,
		},
		{
			name: "v2 max means no limit",
			files: map[string]string{
				"proc/self/cgroup":         "0::/\n",
				"proc/self/mountinfo":      mountinfoV2,
				"sys/fs/cgroup/memory.max": "max\n",
			},
			want: 0,
		},
		{
			name: "v2 systemd unit: a parent's limit bounds the child, the root has no memory.max",
			files: map[string]string{
				"proc/self/cgroup":    "0::/system.slice/leasehold.service\n",
				"proc/self/mountinfo": mountinfoV2,
				"sys/fs/cgroup/system.slice/leasehold.service/memory.max": "max\n",
				"sys/fs/cgroup/system.slice/memory.max":                   "1073741824\n",
				"sys/fs/cgroup/cgroup.controllers":                        "cpu memory\n",
			},
			want: 1 << 30,
		},
		{
			name: "v2 the smallest limit on the way up wins",
			files: map[string]string{
				"proc/self/cgroup":             "0::/a/b\n",
				"proc/self/mountinfo":          mountinfoV2,
				"sys/fs/cgroup/a/b/memory.max": "268435456\n",
				"sys/fs/cgroup/a/memory.max":   "1073741824\n",
			},
			want: 256 << 20,
		},
		{
			name: "v1 container without a cgroup namespace: the mount is the container's cgroup",
			files: map[string]string{
				"proc/self/cgroup": "12:pids:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n",
				"proc/self/mountinfo": "30 22 0:27 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755\n" +
					"34 30 0:31 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "536870912\n",
			},
			want: 512 << 20,
		},
		{
			name: "v1 unlimited",
			files: map[string]string{
				"proc/self/cgroup":                           "4:memory:/\n",
				"proc/self/mountinfo":                        mountinfoHybrid,
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
			},
			want: 0,
		},
		{
			name: "hybrid: memory on v1 is read, not the unified hierarchy",
			files: map[string]string{
				"proc/self/cgroup":    "4:memory:/jobs/j1\n1:cpu,cpuacct:/\n0::/\n",
				"proc/self/mountinfo": mountinfoHybrid,
				"sys/fs/cgroup/memory/jobs/j1/memory.limit_in_bytes": "402653184\n",
				"sys/fs/cgroup/memory/jobs/memory.limit_in_bytes":    "9223372036854771712\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes":         "9223372036854771712\n",
				"sys/fs/cgroup/unified/memory.max":                   "1048576\n", // not this hierarchy's controller
			},
			want: 384 << 20,
		},
		{
			name: "a mount point with an escaped space",
			files: map[string]string{
				"proc/self/cgroup":      "0::/x\n",
				"proc/self/mountinfo":   "24 30 0:22 / /cg\\040roups rw - cgroup2 cgroup2 rw\n",
				"cg roups/x/memory.max": "134217728\n",
			},
			want: 128 << 20,
		},
		{
			name: "a cgroup outside the mounted one is read at the mount point",
			files: map[string]string{
				"proc/self/cgroup":         "0::/../../other\n",
				"proc/self/mountinfo":      "24 30 0:22 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
				"sys/fs/cgroup/memory.max": "268435456\n",
			},
			want: 256 << 20,
		},
		{
			name:  "no /proc/self/cgroup (not Linux)",
			files: map[string]string{"etc/hostname": "x\n"},
			want:  0,
		},
		{
			name: "no cgroup mount",
			files: map[string]string{
				"proc/self/cgroup":    "0::/\n",
				"proc/self/mountinfo": "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n",
			},
			want: 0,
		},
		{
			name: "an unparsable limit is an error",
			files: map[string]string{
				"proc/self/cgroup":         "0::/\n",
				"proc/self/mountinfo":      mountinfoV2,
				"sys/fs/cgroup/memory.max": "lots\n",
			},
			wantErr: true,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := cgroupMemLimit(fakeTree(t, tt.files))
			if (err != nil) != tt.wantErr {
				t.Fatalf("cgroupMemLimit: err %v, want error %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("cgroupMemLimit = %d, want %d", got, tt.want)
			}
		})
	}
}
