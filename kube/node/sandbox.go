package main

// The pod's sandbox: a network namespace per pod on a bridge that lives in a network
// namespace of the node's own (no route leaves it), and, per process, a private mount
// namespace where the pod's volumes, /etc/hosts, /etc/resolv.conf and a /dev with the
// termination-log file are bind-mounted before the process becomes the pod's user.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Mount is one bind mount of a container's process.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// Launch is what the helper (`airflow-tf-node _sandbox SPEC`) does before it execs the
// container's process, inside the pod's network namespace and a mount namespace of its own.
type Launch struct {
	Hostname       string   `json:"hostname"`
	Mounts         []Mount  `json:"mounts"`
	DevDir         string   `json:"devDir"` // scratch dir for the host's /dev while a private /dev is made
	TerminationLog Mount    `json:"terminationLog"`
	UID            int      `json:"uid"`
	GID            int      `json:"gid"`
	Groups         []int    `json:"groups,omitempty"`
	WorkDir        string   `json:"workDir,omitempty"`
	Expose         []string `json:"expose,omitempty"` // the image's directories, shown to a non-root user
	Env            []string
	Argv           []string
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Network is the node's pod network: the bridge's namespace and the addresses handed out.
type Network struct {
	Prefix string // of every network namespace this node makes
	Subnet [3]byte
	used   map[byte]string
}

func (n *Network) bridgeNS() string { return n.Prefix + "-bridge" }

// Start makes the bridge's namespace and the bridge.
func (n *Network) Start() error {
	n.used = map[byte]string{}
	ns := n.bridgeNS()
	_ = ip("netns", "del", ns) // left by an agent that was killed
	for _, args := range [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "add", "br0", "type", "bridge"},
		{"-n", ns, "link", "set", "br0", "up"},
	} {
		if err := ip(args...); err != nil {
			return err
		}
	}
	return nil
}

// Stop removes the bridge's namespace (the pods' are removed with their pods).
func (n *Network) Stop() error { return ip("netns", "del", n.bridgeNS()) }

// Add makes the pod's network namespace, linked to the bridge by a veth pair, and returns
// the namespace's name and the pod's address.
func (n *Network) Add(key string) (string, string, error) {
	var host byte
	for h := byte(2); h < 255; h++ {
		if _, taken := n.used[h]; !taken {
			host = h
			break
		}
	}
	if host == 0 {
		return "", "", fmt.Errorf("no pod address left in %d.%d.%d.0/24", n.Subnet[0], n.Subnet[1], n.Subnet[2])
	}
	n.used[host] = key
	ns := fmt.Sprintf("%s-%d", n.Prefix, host)
	addr := fmt.Sprintf("%d.%d.%d.%d", n.Subnet[0], n.Subnet[1], n.Subnet[2], host)
	veth := fmt.Sprintf("veth%d", host)
	_ = ip("netns", "del", ns)
	// The kernel frees a removed pod's namespace, and with it the bridge's end of its veth pair,
	// only once its last process is gone; an address reused before then would meet "File exists".
	_ = ip("-n", n.bridgeNS(), "link", "del", veth)
	for _, args := range [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", n.bridgeNS(), "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"-n", n.bridgeNS(), "link", "set", veth, "master", "br0", "up"},
		{"-n", ns, "addr", "add", addr + "/24", "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
	} {
		if err := ip(args...); err != nil {
			n.Remove(ns, addr)
			return "", "", err
		}
	}
	return ns, addr, nil
}

// Remove deletes the pod's namespace (and so its veth pair) and frees its address.
func (n *Network) Remove(ns, addr string) {
	_ = ip("netns", "del", ns)
	var host byte
	if _, err := fmt.Sscanf(addr[strings.LastIndex(addr, ".")+1:], "%d", &host); err == nil {
		delete(n.used, host)
	}
}

// runSandbox is the helper's main: mounts, hostname, user, then exec. It runs in the pod's
// network namespace (ip netns exec), which also gave it a mount namespace of its own whose
// mounts do not propagate to the host's.
func runSandbox(spec string) error {
	var l Launch
	if err := json.Unmarshal([]byte(spec), &l); err != nil {
		return err
	}
	if err := syscall.Sethostname([]byte(l.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if l.UID != 0 {
		if err := expose(l.Expose, l.DevDir+"-expose"); err != nil {
			return err
		}
	}
	if err := privateDev(l); err != nil {
		return err
	}
	for _, m := range l.Mounts {
		if err := bind(m); err != nil {
			return err
		}
	}
	if len(l.Groups) > 0 || l.UID != 0 {
		if err := syscall.Setgroups(l.Groups); err != nil {
			return fmt.Errorf("setgroups: %w", err)
		}
	}
	if err := syscall.Setgid(l.GID); err != nil {
		return fmt.Errorf("setgid: %w", err)
	}
	// Leaving uid 0 clears the capability sets (no SECBIT_KEEP_CAPS): no capabilities remain.
	if err := syscall.Setuid(l.UID); err != nil {
		return fmt.Errorf("setuid: %w", err)
	}
	if l.WorkDir != "" {
		if err := os.Chdir(l.WorkDir); err != nil {
			return fmt.Errorf("workingDir: %w", err)
		}
	} else if err := os.Chdir("/"); err != nil {
		return err
	}
	path := l.Argv[0]
	if !strings.Contains(path, "/") {
		for _, kv := range l.Env {
			if strings.HasPrefix(kv, "PATH=") {
				os.Setenv("PATH", kv[5:])
			}
		}
		found, err := exec.LookPath(path)
		if err != nil {
			return fmt.Errorf("%s: executable file not found in $PATH", path)
		}
		path = found
	}
	return syscall.Exec(path, l.Argv, l.Env)
}

// expose makes the image's directories reachable by a non-root user when a directory above
// them is not (a virtual environment under /root): that directory becomes an empty tmpfs in
// the process's mount namespace (the rest of it hidden), with the image's directories bound
// back at their paths.
func expose(paths []string, scratch string) error {
	type move struct{ from, to string }
	var moves []move
	covers := map[string]bool{}
	for i, path := range paths {
		closed := ""
		for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
			if info, err := os.Stat(dir); err == nil && info.Mode().Perm()&0o001 == 0 {
				closed = dir // the topmost one others cannot pass
			}
			if dir == "/" {
				break
			}
		}
		if closed == "" {
			continue
		}
		from := fmt.Sprintf("%s/%d", scratch, i)
		if err := os.MkdirAll(from, 0o700); err != nil {
			return err
		}
		if err := syscall.Mount(path, from, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			return fmt.Errorf("expose %s: %w", path, err)
		}
		moves = append(moves, move{from, path})
		covers[closed] = true
	}
	for dir := range covers {
		if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=755"); err != nil {
			return fmt.Errorf("expose: tmpfs on %s: %w", dir, err)
		}
	}
	for _, m := range moves {
		if err := os.MkdirAll(m.to, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount(m.from, m.to, "", syscall.MS_MOVE, ""); err != nil {
			return fmt.Errorf("expose %s: %w", m.to, err)
		}
	}
	return nil
}

func bind(m Mount) error {
	if strings.HasPrefix(m.Target, "/dev/") { // the tmpfs of privateDev: mount points made here
		if err := devMountpoint(m.Source, m.Target); err != nil {
			return err
		}
	}
	if err := mountpoint(m.Source, m.Target); err != nil {
		return err
	}
	if err := syscall.Mount(m.Source, m.Target, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("mount %s at %s: %w", m.Source, m.Target, err)
	}
	if m.ReadOnly {
		if err := syscall.Mount("", m.Target, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("read-only %s: %w", m.Target, err)
		}
	}
	return nil
}

// mountpoint checks that target exists as a file or directory like source (the agent made
// the missing ones on the host before the process started, and removes them afterwards).
func mountpoint(source, target string) error {
	st, err := os.Stat(source)
	if err != nil {
		return err
	}
	tt, err := os.Stat(target)
	if err != nil {
		return fmt.Errorf("mount point %s: %w", target, err)
	}
	if st.IsDir() != tt.IsDir() {
		return fmt.Errorf("mount point %s: a directory and a file", target)
	}
	return nil
}

func devMountpoint(source, target string) error {
	if _, err := os.Lstat(target); err == nil {
		return nil
	}
	st, err := os.Stat(source)
	if err != nil {
		return err
	}
	if st.IsDir() {
		return os.MkdirAll(target, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	return os.WriteFile(target, nil, 0o644)
}

// privateDev puts a tmpfs on /dev holding the host's character devices, pts and a shm of its
// own, and the container's termination-log file, so nothing is written to the host's /dev.
func privateDev(l Launch) error {
	if l.DevDir == "" {
		return nil
	}
	old := l.DevDir
	steps := []func() error{
		func() error { return syscall.Mount("/dev", old, "", syscall.MS_BIND|syscall.MS_REC, "") },
		func() error { return syscall.Mount("tmpfs", "/dev", "tmpfs", syscall.MS_NOSUID, "mode=755") },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return fmt.Errorf("private /dev: %w", err)
		}
	}
	for _, name := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if err := os.WriteFile("/dev/"+name, nil, 0o666); err != nil {
			return err
		}
		if err := syscall.Mount(filepath.Join(old, name), "/dev/"+name, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("/dev/%s: %w", name, err)
		}
	}
	for _, dir := range []string{"/dev/pts", "/dev/shm"} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
	}
	if err := syscall.Mount(filepath.Join(old, "pts"), "/dev/pts", "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("/dev/pts: %w", err)
	}
	if err := syscall.Mount("shm", "/dev/shm", "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("/dev/shm: %w", err)
	}
	for link, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"} {
		if err := os.Symlink(target, "/dev/"+link); err != nil {
			return err
		}
	}
	if err := syscall.Unmount(old, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("private /dev: %w", err)
	}
	if t := l.TerminationLog; t.Target != "" && strings.HasPrefix(t.Target, "/dev/") {
		return bind(t)
	}
	return nil
}
