package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// Provider runs each pod's containers as local processes (see the package doc).
type Provider struct {
	Images        Images
	Net           *Network
	Client        kubernetes.Interface
	Events        record.EventRecorder
	StateDir      string
	Self          string // this binary, the sandbox helper
	HostIP        string
	DNS           string // the pods' nameserver; none when empty
	ClusterDomain string
	Backoff       time.Duration // first restart delay, doubled up to 5 minutes

	mu          sync.Mutex
	pods        map[string]*podRun
	notify      func(*corev1.Pod)
	mountpoints map[string]int // made on the host for mounts: top directory -> pods using it
}

type podRun struct {
	pod        *corev1.Pod
	dir        string
	netns, ip  string
	containers []*container
	volumes    map[string]string // volume name -> host path
	created    []string          // mount points made on the host
	deleted    chan struct{}
	finished   bool
	torn       bool
	started    metav1.Time
}

type container struct {
	spec    *corev1.Container
	status  corev1.ContainerStatus
	pid     int
	exited  chan struct{}
	logPath string
}

func podKey(namespace, name string) string { return namespace + "/" + name }

// NotifyPods registers the callback the pod controller is told status changes by.
func (p *Provider) NotifyPods(_ context.Context, notify func(*corev1.Pod)) {
	p.mu.Lock()
	p.notify = notify
	p.mu.Unlock()
}

// update applies change under the lock, then tells the pod controller the pod's new status.
func (p *Provider) update(r *podRun, change func()) {
	p.mu.Lock()
	change()
	pod := r.snapshot()
	notify := p.notify
	p.mu.Unlock()
	if notify != nil {
		notify(pod)
	}
}

// snapshot is the pod with its current status (the caller holds the lock).
func (r *podRun) snapshot() *corev1.Pod {
	pod := r.pod.DeepCopy()
	s := &pod.Status
	s.HostIP, s.PodIP, s.StartTime = pod.Status.HostIP, r.ip, &r.started
	if r.ip != "" {
		s.PodIPs = []corev1.PodIP{{IP: r.ip}}
	}
	if s.HostIP != "" {
		s.HostIPs = []corev1.HostIP{{IP: s.HostIP}}
	}
	s.ContainerStatuses = nil
	ready := corev1.ConditionTrue
	for _, c := range r.containers {
		s.ContainerStatuses = append(s.ContainerStatuses, *c.status.DeepCopy())
		if !c.status.Ready {
			ready = corev1.ConditionFalse
		}
	}
	s.Phase = Phase(s.ContainerStatuses, r.finished)
	now := metav1.Now()
	s.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: r.started},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: r.started},
		{Type: corev1.ContainersReady, Status: ready, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: ready, LastTransitionTime: now},
	}
	return pod
}

// CreatePod starts the pod: its sandbox, then a supervisor per container.
func (p *Provider) CreatePod(_ context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	key := podKey(pod.Namespace, pod.Name)
	if _, ok := p.pods[key]; ok {
		p.mu.Unlock()
		return nil
	}
	r := &podRun{pod: pod.DeepCopy(), deleted: make(chan struct{}), started: metav1.Now(),
		dir: filepath.Join(p.StateDir, "pods", string(pod.UID))}
	r.pod.Status.HostIP = p.HostIP
	for i := range r.pod.Spec.Containers {
		c := &r.pod.Spec.Containers[i]
		r.containers = append(r.containers, &container{spec: c, status: corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}})
	}
	p.pods[key] = r
	p.mu.Unlock()
	go p.run(r)
	return nil
}

// UpdatePod has nothing to do: a running pod's spec does not change what this node runs.
func (p *Provider) UpdatePod(context.Context, *corev1.Pod) error { return nil }

func (p *Provider) run(r *podRun) {
	if err := p.setup(r); err != nil {
		p.Events.Eventf(r.pod, corev1.EventTypeWarning, "FailedMount", "%v", err)
		p.update(r, func() {
			for _, c := range r.containers {
				c.status.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
					Reason: "CreateContainerConfigError", Message: err.Error()}}
			}
		})
		<-r.deleted
		p.finish(r)
		return
	}
	p.update(r, func() {})
	var wg sync.WaitGroup
	for _, c := range r.containers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.supervise(r, c)
		}()
	}
	wg.Wait()
	p.finish(r)
}

// finish marks the pod done and removes its sandbox; its logs stay until it is deleted.
func (p *Provider) finish(r *podRun) {
	p.teardown(r)
	p.update(r, func() { r.finished = true })
}

func (p *Provider) teardown(r *podRun) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.torn {
		return
	}
	r.torn = true
	if r.netns != "" {
		if out, err := exec.Command("ip", "netns", "pids", r.netns).Output(); err == nil {
			for _, field := range strings.Fields(string(out)) {
				var pid int
				if _, err := fmt.Sscan(field, &pid); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		p.Net.Remove(r.netns, r.ip)
	}
	for _, top := range r.created {
		p.mountpoints[top]--
		if p.mountpoints[top] <= 0 {
			delete(p.mountpoints, top)
			removeEmpty(top)
		}
	}
	p.saveMountpoints()
}

// removeEmpty removes path if it holds nothing but empty directories and empty files (a mount
// point made for the pods is empty on the host: what the pods write goes to their volumes).
func removeEmpty(path string) {
	info, err := os.Lstat(path)
	if err != nil {
		return
	}
	switch {
	case info.IsDir():
		entries, _ := os.ReadDir(path)
		for _, e := range entries {
			removeEmpty(filepath.Join(path, e.Name()))
		}
		_ = os.Remove(path)
	case info.Mode().IsRegular() && info.Size() == 0:
		_ = os.Remove(path)
	}
}

// saveMountpoints records the mount points made on the host, for `scripts/kube down` should
// this agent be killed (the caller holds the lock).
func (p *Provider) saveMountpoints() {
	tops := make([]string, 0, len(p.mountpoints))
	for top := range p.mountpoints {
		tops = append(tops, top)
	}
	sort.Strings(tops)
	_ = os.WriteFile(filepath.Join(p.StateDir, "mountpoints"), []byte(strings.Join(tops, "\n")), 0o644)
}

// setup makes the pod's directory, network namespace, hosts and resolv.conf, and volumes.
func (p *Provider) setup(r *podRun) error {
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return err
	}
	p.mu.Lock()
	ns, addr, err := p.Net.Add(string(r.pod.UID))
	if err == nil {
		r.netns, r.ip = ns, addr
	}
	p.mu.Unlock()
	if err != nil {
		return err
	}
	pod := r.pod
	hostname := pod.Spec.Hostname
	if hostname == "" {
		hostname = pod.Name
	}
	names := hostname
	if pod.Spec.Subdomain != "" {
		names = fmt.Sprintf("%s.%s.%s.svc.%s %s", hostname, pod.Spec.Subdomain, pod.Namespace, p.ClusterDomain, hostname)
	}
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n", addr, names)
	resolv := ""
	if p.DNS != "" {
		resolv = fmt.Sprintf("nameserver %s\nsearch %s.svc.%s svc.%s %s\noptions ndots:5\n",
			p.DNS, pod.Namespace, p.ClusterDomain, p.ClusterDomain, p.ClusterDomain)
	}
	for name, text := range map[string]string{"hosts": hosts, "resolv.conf": resolv} {
		if err := os.WriteFile(filepath.Join(r.dir, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	r.volumes = map[string]string{}
	for _, v := range pod.Spec.Volumes {
		path, err := p.volume(r, v)
		if err != nil {
			return fmt.Errorf("volume %q: %w", v.Name, err)
		}
		r.volumes[v.Name] = path
	}
	return nil
}

// volume is the host directory of one of the pod's volumes.
func (p *Provider) volume(r *podRun, v corev1.Volume) (string, error) {
	ctx := context.Background()
	own := filepath.Join(r.dir, "volumes", v.Name)
	switch {
	case v.HostPath != nil:
		if v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathDirectoryOrCreate {
			if err := os.MkdirAll(v.HostPath.Path, 0o755); err != nil {
				return "", err
			}
		}
		return v.HostPath.Path, nil
	case v.PersistentVolumeClaim != nil:
		claim, err := p.Client.CoreV1().PersistentVolumeClaims(r.pod.Namespace).Get(ctx, v.PersistentVolumeClaim.ClaimName, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		if claim.Spec.VolumeName == "" {
			return "", fmt.Errorf("claim %s is not bound", claim.Name)
		}
		pv, err := p.Client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		switch {
		case pv.Spec.HostPath != nil:
			return pv.Spec.HostPath.Path, nil
		case pv.Spec.Local != nil:
			return pv.Spec.Local.Path, nil
		}
		return "", fmt.Errorf("volume %s is neither hostPath nor local: this node mounts only those", pv.Name)
	case v.EmptyDir != nil:
		if err := os.MkdirAll(own, 0o777); err != nil {
			return "", err
		}
		return own, os.Chmod(own, 0o777) // as the kubelet makes an emptyDir
	case v.Secret != nil:
		secret, err := p.Client.CoreV1().Secrets(r.pod.Namespace).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		return own, writeKeys(own, secret.Data, v.Secret.Items)
	case v.ConfigMap != nil:
		cm, err := p.Client.CoreV1().ConfigMaps(r.pod.Namespace).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		return own, writeKeys(own, configMapData(cm), v.ConfigMap.Items)
	case v.Projected != nil:
		for _, source := range v.Projected.Sources {
			if err := p.project(r, own, source); err != nil {
				return "", err
			}
		}
		return own, nil
	}
	return "", fmt.Errorf("this node mounts hostPath, persistentVolumeClaim (hostPath or local volumes), " +
		"emptyDir, secret, configMap and projected volumes only")
}

// project writes one source of a projected volume (the service account token volume the API
// server adds to pods: a token, the cluster's CA, the namespace).
func (p *Provider) project(r *podRun, dir string, source corev1.VolumeProjection) error {
	ctx := context.Background()
	switch {
	case source.ServiceAccountToken != nil:
		t := source.ServiceAccountToken
		request := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: t.ExpirationSeconds,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: r.pod.Name, UID: r.pod.UID}}}
		if t.Audience != "" {
			request.Spec.Audiences = []string{t.Audience}
		}
		token, err := p.Client.CoreV1().ServiceAccounts(r.pod.Namespace).CreateToken(ctx, r.pod.Spec.ServiceAccountName, request, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		return writeKeys(dir, map[string][]byte{t.Path: []byte(token.Status.Token)}, nil)
	case source.ConfigMap != nil:
		cm, err := p.Client.CoreV1().ConfigMaps(r.pod.Namespace).Get(ctx, source.ConfigMap.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return writeKeys(dir, configMapData(cm), source.ConfigMap.Items)
	case source.Secret != nil:
		secret, err := p.Client.CoreV1().Secrets(r.pod.Namespace).Get(ctx, source.Secret.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return writeKeys(dir, secret.Data, source.Secret.Items)
	case source.DownwardAPI != nil:
		data := map[string][]byte{}
		for _, item := range source.DownwardAPI.Items {
			if item.FieldRef == nil {
				return fmt.Errorf("downwardAPI %s: only fieldRef items are supported", item.Path)
			}
			value, err := FieldValue(r.pod, item.FieldRef.FieldPath, r.ip, r.pod.Status.HostIP)
			if err != nil {
				return err
			}
			data[item.Path] = []byte(value)
		}
		return writeKeys(dir, data, nil)
	}
	return fmt.Errorf("projected volume source not supported by this node")
}

func configMapData(cm *corev1.ConfigMap) map[string][]byte {
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return data
}

func writeKeys(dir string, data map[string][]byte, items []corev1.KeyToPath) error {
	paths := map[string]string{}
	for k := range data {
		paths[k] = k
	}
	if len(items) > 0 {
		paths = map[string]string{}
		for _, item := range items {
			paths[item.Key] = item.Path
		}
	}
	for key, path := range paths {
		target := filepath.Join(dir, filepath.Clean("/"+path))
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(target, data[key], 0o644); err != nil {
			return err
		}
	}
	return os.MkdirAll(dir, 0o755)
}

// launch is the helper's spec for a process of container c: the container itself, or its probe.
func (p *Provider) launch(r *podRun, c *container, image Image, argv []string) (Launch, error) {
	pod, spec := r.pod, c.spec
	env, err := Environment(pod, spec, image, r.ip, pod.Status.HostIP)
	if err != nil {
		return Launch{}, err
	}
	if argv == nil {
		if argv, err = Argv(spec, image, env); err != nil {
			return Launch{}, err
		}
	}
	uid, gid, groups, err := identity(pod, spec)
	if err != nil {
		return Launch{}, err
	}
	l := Launch{Hostname: pod.Spec.Hostname, UID: uid, GID: gid, Groups: groups, WorkDir: spec.WorkingDir,
		Env: env, Argv: argv, DevDir: filepath.Join(r.dir, "dev-"+spec.Name), Expose: append([]string{image.Path}, image.Expose...)}
	if l.Hostname == "" {
		l.Hostname = pod.Name
	}
	if spec.TerminationMessagePath != "" {
		l.TerminationLog = Mount{Source: filepath.Join(r.dir, spec.Name+".termination-log"), Target: spec.TerminationMessagePath}
	}
	l.Mounts = []Mount{{Source: filepath.Join(r.dir, "hosts"), Target: "/etc/hosts", ReadOnly: true},
		{Source: filepath.Join(r.dir, "resolv.conf"), Target: "/etc/resolv.conf", ReadOnly: true}}
	for _, m := range spec.VolumeMounts {
		source, ok := r.volumes[m.Name]
		if !ok {
			return Launch{}, fmt.Errorf("volumeMount %q names no volume of the pod", m.Name)
		}
		l.Mounts = append(l.Mounts, Mount{Source: filepath.Join(source, filepath.Clean("/"+m.SubPath)),
			Target: m.MountPath, ReadOnly: m.ReadOnly})
	}
	sort.SliceStable(l.Mounts, func(i, j int) bool { return len(l.Mounts[i].Target) < len(l.Mounts[j].Target) })
	return l, nil
}

// identity is the process's uid, gid and groups from the security contexts, refusing root
// when runAsNonRoot asks (this node has no image metadata: the default user is root).
func identity(pod *corev1.Pod, c *corev1.Container) (int, int, []int, error) {
	var uid, gid *int64
	nonRoot := false
	groups := []int{}
	if psc := pod.Spec.SecurityContext; psc != nil {
		uid, gid = psc.RunAsUser, psc.RunAsGroup
		nonRoot = psc.RunAsNonRoot != nil && *psc.RunAsNonRoot
		if psc.FSGroup != nil {
			groups = append(groups, int(*psc.FSGroup))
		}
		for _, g := range psc.SupplementalGroups {
			groups = append(groups, int(g))
		}
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = sc.RunAsGroup
		}
		if sc.RunAsNonRoot != nil {
			nonRoot = *sc.RunAsNonRoot
		}
	}
	u, g := 0, 0
	if uid != nil {
		u = int(*uid)
	}
	if gid != nil {
		g = int(*gid)
	}
	if nonRoot && u == 0 {
		return 0, 0, nil, fmt.Errorf("container has runAsNonRoot and image will run as root")
	}
	return u, g, groups, nil
}

// ensureMountpoints makes on the host the mount points that do not exist yet (empty
// directories, or empty files for a file's mount), counting the pods that use them.
func (p *Provider) ensureMountpoints(r *podRun, mounts []Mount) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range mounts {
		if m.Target == "" || strings.HasPrefix(m.Target, "/dev/") { // the process's own /dev
			continue
		}
		shared := ""
		for top := range p.mountpoints {
			if m.Target == top || strings.HasPrefix(m.Target, top+"/") {
				shared = top
			}
		}
		if _, err := os.Lstat(m.Target); err == nil {
			if shared != "" { // made for another pod: removed once neither uses it
				p.mountpoints[shared]++
				r.created = append(r.created, shared)
			}
			continue
		}
		top := m.Target
		for parent := filepath.Dir(top); parent != "/"; parent = filepath.Dir(parent) {
			if _, err := os.Lstat(parent); err == nil {
				break
			}
			top = parent
		}
		st, err := os.Stat(m.Source)
		if err != nil {
			return fmt.Errorf("mount of %s: %w", m.Target, err)
		}
		if st.IsDir() {
			err = os.MkdirAll(m.Target, 0o755)
		} else if err = os.MkdirAll(filepath.Dir(m.Target), 0o755); err == nil {
			err = os.WriteFile(m.Target, nil, 0o644)
		}
		if err != nil {
			return err
		}
		p.mountpoints[top]++
		p.saveMountpoints()
		r.created = append(r.created, top)
	}
	return nil
}

// start starts the helper that becomes the process described by l in the pod's namespaces.
func (p *Provider) start(r *podRun, l Launch, out io.Writer) (*exec.Cmd, error) {
	spec, err := json.Marshal(l)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("ip", "netns", "exec", r.netns, p.Self, "_sandbox", string(spec))
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Cloneflags: syscall.CLONE_NEWUTS, Pdeathsig: syscall.SIGKILL}
	return cmd, cmd.Start()
}

func (p *Provider) waitingForever(r *podRun, c *container, reason, message string) {
	p.Events.Eventf(r.pod, corev1.EventTypeWarning, "Failed", "container %s: %s: %s", c.spec.Name, reason, message)
	p.update(r, func() {
		c.status.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}
	})
	<-r.deleted
}

// supervise runs container c until it stops for good: restarted per the pod's restartPolicy,
// killed by its probes, or stopped by the pod's deletion.
func (p *Provider) supervise(r *podRun, c *container) {
	image, ok := p.Images.Lookup(c.spec.Image)
	if !ok {
		p.waitingForever(r, c, "ErrImagePull", fmt.Sprintf("image %q is not in this node's image table "+
			"(airflow-tf-node maps images to local environments; it pulls none)", c.spec.Image))
		return
	}
	l, err := p.launch(r, c, image, nil)
	if err == nil {
		err = p.ensureMountpoints(r, append(l.Mounts, l.TerminationLog))
	}
	if err != nil {
		p.waitingForever(r, c, "CreateContainerConfigError", err.Error())
		return
	}
	p.Events.Eventf(r.pod, corev1.EventTypeNormal, "Pulled", "container %s: image %q is %s on this node", c.spec.Name, c.spec.Image, image.Path)
	backoff := p.Backoff
	for {
		select {
		case <-r.deleted:
			return
		default:
		}
		code, reason, message, startedAt := p.runOnce(r, c, l)
		restart := Restarts(r.pod.Spec.RestartPolicy, code)
		select {
		case <-r.deleted:
			restart = false
		default:
		}
		terminated := &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, Message: message,
			StartedAt: startedAt, FinishedAt: metav1.Now(), ContainerID: c.status.ContainerID}
		if !restart {
			p.update(r, func() {
				c.status.State = corev1.ContainerState{Terminated: terminated}
				c.status.Ready, c.status.Started = false, ptr(false)
			})
			return
		}
		p.update(r, func() {
			c.status.LastTerminationState = corev1.ContainerState{Terminated: terminated}
			c.status.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
				Message: fmt.Sprintf("back-off %s restarting failed container %s", backoff, c.spec.Name)}}
			c.status.Ready, c.status.Started = false, ptr(false)
			c.status.RestartCount++
		})
		select {
		case <-r.deleted:
			p.update(r, func() { c.status.State = corev1.ContainerState{Terminated: terminated} })
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Minute)
	}
}

func ptr[T any](v T) *T { return &v }

// runOnce runs the container's process once, with its probes, and says how it ended.
func (p *Provider) runOnce(r *podRun, c *container, l Launch) (int32, string, string, metav1.Time) {
	p.mu.Lock()
	restarts := c.status.RestartCount
	p.mu.Unlock()
	c.logPath = filepath.Join(r.dir, fmt.Sprintf("%s.%d.log", c.spec.Name, restarts))
	startedAt := metav1.Now()
	if err := os.MkdirAll(l.DevDir, 0o755); err != nil {
		return 128, "StartError", err.Error(), startedAt
	}
	if l.TerminationLog.Source != "" {
		if err := os.WriteFile(l.TerminationLog.Source, nil, 0o666); err != nil {
			return 128, "StartError", err.Error(), startedAt
		}
		_ = os.Chmod(l.TerminationLog.Source, 0o666)
	}
	out, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 128, "StartError", err.Error(), startedAt
	}
	defer out.Close()
	cmd, err := p.start(r, l, out)
	if err != nil {
		return 128, "StartError", err.Error(), startedAt
	}
	exited := make(chan struct{})
	p.update(r, func() {
		c.pid, c.exited = cmd.Process.Pid, exited
		c.status.ContainerID = fmt.Sprintf("airflow-tf-node://%s/%d", r.pod.UID, cmd.Process.Pid)
		c.status.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: startedAt}}
		started := c.spec.StartupProbe == nil
		c.status.Started, c.status.Ready = &started, started
	})
	go p.probe(r, c, cmd.Process.Pid, exited)
	_ = cmd.Wait()
	close(exited)
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // what the container's process left running
	status, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	code, reason := Terminated(status)
	return code, reason, TerminationMessage(c.spec, l.TerminationLog.Source, c.logPath, code), startedAt
}

// kill stops a container's process group: SIGTERM, then SIGKILL after grace.
func kill(pid int, exited <-chan struct{}, grace time.Duration) {
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}

func gracePeriod(pod *corev1.Pod) time.Duration {
	if pod.DeletionGracePeriodSeconds != nil {
		return time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	}
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

// probe runs the startup probe until it succeeds, then the liveness probe, killing the
// container when one fails failureThreshold times in a row. Only exec probes run: others
// count as successes (the manifests use exec probes).
func (p *Provider) probe(r *podRun, c *container, pid int, exited <-chan struct{}) {
	for i, probe := range []*corev1.Probe{c.spec.StartupProbe, c.spec.LivenessProbe} {
		if probe == nil || probe.Exec == nil {
			continue
		}
		select {
		case <-exited:
			return
		case <-time.After(time.Duration(probe.InitialDelaySeconds) * time.Second):
		}
		failures := int32(0)
		for {
			if err := p.execProbe(r, c, probe); err == nil {
				failures = 0
				if i == 0 {
					p.update(r, func() { c.status.Started, c.status.Ready = ptr(true), true })
					break
				}
			} else if failures++; failures >= max(probe.FailureThreshold, 1) {
				kind := []string{"Startup", "Liveness"}[i]
				p.Events.Eventf(r.pod, corev1.EventTypeWarning, "Unhealthy", "%s probe failed: %v", kind, err)
				p.Events.Eventf(r.pod, corev1.EventTypeNormal, "Killing", "Container %s failed %s probe, will be restarted", c.spec.Name, strings.ToLower(kind))
				grace := gracePeriod(r.pod)
				if probe.TerminationGracePeriodSeconds != nil {
					grace = time.Duration(*probe.TerminationGracePeriodSeconds) * time.Second
				}
				kill(pid, exited, grace)
				return
			}
			select {
			case <-exited:
				return
			case <-time.After(time.Duration(max(probe.PeriodSeconds, 1)) * time.Second):
			}
		}
	}
}

// execProbe runs the probe's command in the container's namespaces, as its user, within the
// probe's timeout.
func (p *Provider) execProbe(r *podRun, c *container, probe *corev1.Probe) error {
	image, _ := p.Images.Lookup(c.spec.Image)
	l, err := p.launch(r, c, image, probe.Exec.Command)
	if err != nil {
		return err
	}
	l.DevDir, l.TerminationLog = filepath.Join(r.dir, "dev-probe-"+c.spec.Name), Mount{}
	if err := os.MkdirAll(l.DevDir, 0o755); err != nil {
		return err
	}
	var out strings.Builder
	cmd, err := p.start(r, l, &out)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%v: %s", err, strings.TrimSpace(out.String()))
		}
		return nil
	case <-time.After(time.Duration(max(probe.TimeoutSeconds, 1)) * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return fmt.Errorf("command timed out after %ds", max(probe.TimeoutSeconds, 1))
	}
}

// DeletePod stops the pod's containers (SIGTERM, SIGKILL after the grace period); its
// supervisor then reports them terminated and removes the sandbox.
func (p *Provider) DeletePod(_ context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	key := podKey(pod.Namespace, pod.Name)
	r, ok := p.pods[key]
	if !ok || r.pod.UID != pod.UID {
		p.mu.Unlock()
		return errdefs.NotFoundf("pod %s is not on this node", key)
	}
	first := false
	select {
	case <-r.deleted:
	default:
		close(r.deleted)
		first = true
		r.pod.DeletionTimestamp, r.pod.DeletionGracePeriodSeconds = pod.DeletionTimestamp, pod.DeletionGracePeriodSeconds
	}
	finished := r.finished
	if finished {
		delete(p.pods, key)
		_ = os.RemoveAll(r.dir)
	}
	var running []*container
	for _, c := range r.containers {
		if c.status.State.Running != nil {
			running = append(running, c)
		}
	}
	grace := gracePeriod(r.pod)
	p.mu.Unlock()
	if finished {
		p.update(r, func() {})
		return nil
	}
	if first {
		for _, c := range running {
			go kill(c.pid, c.exited, grace)
		}
		go func() { // once the supervisor is done: forget the pod, remove its files
			for !p.isFinished(r) {
				time.Sleep(200 * time.Millisecond)
			}
			p.mu.Lock()
			if p.pods[key] == r {
				delete(p.pods, key)
			}
			p.mu.Unlock()
			_ = os.RemoveAll(r.dir)
		}()
	}
	return nil
}

func (p *Provider) isFinished(r *podRun) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return r.finished
}

// Shutdown stops every pod (as on deletion, with at most grace) and removes every sandbox.
func (p *Provider) Shutdown(grace time.Duration) {
	p.mu.Lock()
	var runs []*podRun
	for _, r := range p.pods {
		runs = append(runs, r)
	}
	p.mu.Unlock()
	for _, r := range runs {
		p.mu.Lock()
		select {
		case <-r.deleted:
		default:
			close(r.deleted)
		}
		for _, c := range r.containers {
			if c.status.State.Running != nil {
				go kill(c.pid, c.exited, min(grace, gracePeriod(r.pod)))
			}
		}
		p.mu.Unlock()
	}
	deadline := time.Now().Add(grace + 5*time.Second)
	for _, r := range runs {
		for !p.isFinished(r) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		p.teardown(r)
	}
}

func (p *Provider) find(namespace, name string) (*podRun, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.pods[podKey(namespace, name)]
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not on this node", namespace, name)
	}
	return r, nil
}

// GetPod is the pod as this node runs it.
func (p *Provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	r, err := p.find(namespace, name)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return r.snapshot(), nil
}

// GetPodStatus is the pod's status as this node sees it.
func (p *Provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods lists the pods this node runs.
func (p *Provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pods := make([]*corev1.Pod, 0, len(p.pods))
	for _, r := range p.pods {
		pods = append(pods, r.snapshot())
	}
	return pods, nil
}

// GetContainerLogs serves a container's output (stdout and stderr, interleaved as written).
func (p *Provider) GetContainerLogs(ctx context.Context, namespace, name, containerName string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	r, err := p.find(namespace, name)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	var c *container
	for _, candidate := range r.containers {
		if candidate.spec.Name == containerName {
			c = candidate
		}
	}
	var restarts int32
	var exited chan struct{}
	if c != nil {
		restarts, exited = c.status.RestartCount, c.exited
	}
	p.mu.Unlock()
	if c == nil {
		return nil, errdefs.NotFoundf("container %s is not in pod %s/%s", containerName, namespace, name)
	}
	if opts.Previous {
		if restarts == 0 {
			return nil, errdefs.InvalidInputf("previous terminated container %s in pod %s not found", containerName, name)
		}
		restarts--
		exited = nil
	}
	path := filepath.Join(r.dir, fmt.Sprintf("%s.%d.log", containerName, restarts))
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, errdefs.InvalidInputf("container %s in pod %s is waiting to start", containerName, name)
	}
	size := int64(len(data))
	if opts.Tail > 0 {
		lines := strings.SplitAfter(string(data), "\n")
		if lines[len(lines)-1] == "" {
			lines = lines[:len(lines)-1]
		}
		if len(lines) > opts.Tail {
			lines = lines[len(lines)-opts.Tail:]
		}
		data = []byte(strings.Join(lines, ""))
	}
	if opts.LimitBytes > 0 && len(data) > opts.LimitBytes {
		data = data[:opts.LimitBytes]
	}
	if !opts.Follow || exited == nil {
		return io.NopCloser(strings.NewReader(string(data))), nil
	}
	return follow(ctx, path, size, data, exited)
}

// follow streams what was read, then what the container writes, until it exits.
func follow(ctx context.Context, path string, offset int64, head []byte, exited <-chan struct{}) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	full, _ := f.Stat()
	if _, err := f.Seek(min(offset, full.Size()), io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	reader, writer := io.Pipe()
	go func() {
		defer f.Close()
		if _, err := writer.Write(head); err != nil {
			return
		}
		in := bufio.NewReader(f)
		buf := make([]byte, 32*1024)
		for {
			n, err := in.Read(buf)
			if n > 0 {
				if _, err := writer.Write(buf[:n]); err != nil {
					return
				}
			}
			if err == io.EOF {
				select {
				case <-exited:
					if n == 0 {
						writer.Close()
						return
					}
				case <-ctx.Done():
					writer.CloseWithError(ctx.Err())
					return
				case <-time.After(200 * time.Millisecond):
				}
			} else if err != nil {
				writer.CloseWithError(err)
				return
			}
		}
	}()
	return reader, nil
}

var errUnsupported = errdefs.InvalidInput("not supported by airflow-tf-node")

// RunInContainer (kubectl exec) is not supported.
func (p *Provider) RunInContainer(context.Context, string, string, string, []string, api.AttachIO) error {
	return errUnsupported
}

// AttachToContainer (kubectl attach) is not supported.
func (p *Provider) AttachToContainer(context.Context, string, string, string, api.AttachIO) error {
	return errUnsupported
}

// GetStatsSummary is not supported.
func (p *Provider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return nil, errUnsupported
}

// GetMetricsResource is not supported.
func (p *Provider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, errUnsupported
}

// PortForward is not supported.
func (p *Provider) PortForward(context.Context, string, string, int32, io.ReadWriteCloser) error {
	return errUnsupported
}
