package main

// The provider's pure parts: what a container's process is given (its environment, the
// image's local environment) and how what became of it reads in the pod's status.

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"syscall"

	corev1 "k8s.io/api/core/v1"
)

// Image is the local environment an image name stands for on this node.
type Image struct {
	// Path is a directory whose bin/ goes first on PATH (a virtual environment's prefix).
	Path string `json:"path"`
	// Entrypoint is run when a container gives no command (the image's ENTRYPOINT).
	Entrypoint []string `json:"entrypoint,omitempty"`
	// Expose lists more directories the image needs (a virtual environment's base interpreter):
	// with Path, they are made reachable to a non-root user when a directory above them is not.
	Expose []string `json:"expose,omitempty"`
}

// Images maps image references to local environments.
type Images map[string]Image

// ParseImages reads the image table: {"image": "/prefix"} or {"image": {"path": ..., "entrypoint": [...]}}.
func ParseImages(data []byte) (Images, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("the image table is not a JSON object: %w", err)
	}
	images := Images{}
	for name, value := range raw {
		var image Image
		var path string
		if err := json.Unmarshal(value, &path); err == nil {
			image.Path = path
		} else if err := json.Unmarshal(value, &image); err != nil {
			return nil, fmt.Errorf("image %q: want a directory or {\"path\": ..., \"entrypoint\": [...]}: %w", name, err)
		}
		if !strings.HasPrefix(image.Path, "/") {
			return nil, fmt.Errorf("image %q: %q is not an absolute directory", name, image.Path)
		}
		images[normalizeImage(name)] = image
	}
	return images, nil
}

// Lookup finds an image as a runtime would: "python:3" and "docker.io/library/python:3" are one.
func (images Images) Lookup(ref string) (Image, bool) {
	image, ok := images[normalizeImage(ref)]
	return image, ok
}

func normalizeImage(ref string) string {
	name, tag := ref, ""
	if at := strings.Index(ref, "@"); at >= 0 {
		name, tag = ref[:at], ref[at:]
	} else if colon := strings.LastIndex(ref, ":"); colon > strings.LastIndex(ref, "/") {
		name, tag = ref[:colon], ref[colon:]
	}
	if tag == "" {
		tag = ":latest"
	}
	name = strings.TrimPrefix(name, "docker.io/")
	name = strings.TrimPrefix(name, "index.docker.io/")
	name = strings.TrimPrefix(name, "library/")
	return name + tag
}

// FieldValue is the downward API's value of fieldPath for the pod (the fields a kubelet resolves).
func FieldValue(pod *corev1.Pod, fieldPath, podIP, hostIP string) (string, error) {
	switch fieldPath {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.podIPs":
		return podIP, nil
	case "status.hostIP", "status.hostIPs":
		return hostIP, nil
	}
	for prefix, values := range map[string]map[string]string{
		"metadata.labels": pod.Labels, "metadata.annotations": pod.Annotations} {
		if fieldPath == prefix {
			keys := make([]string, 0, len(values))
			for k := range values {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			lines := make([]string, len(keys))
			for i, k := range keys {
				lines[i] = fmt.Sprintf("%s=%q", k, values[k])
			}
			return strings.Join(lines, "\n"), nil
		}
		if strings.HasPrefix(fieldPath, prefix+"['") && strings.HasSuffix(fieldPath, "']") {
			return values[fieldPath[len(prefix)+2:len(fieldPath)-2]], nil
		}
	}
	return "", fmt.Errorf("fieldRef %q is not supported by airflow-tf-node", fieldPath)
}

// Environment is the container's environment as the kubelet builds it: the image's PATH, then
// each variable in order, with $(VAR) references to earlier ones expanded, fieldRefs resolved.
// Values from Secrets and ConfigMaps are refused (this node reads neither).
func Environment(pod *corev1.Pod, c *corev1.Container, image Image, podIP, hostIP string) ([]string, error) {
	if len(c.EnvFrom) > 0 {
		return nil, fmt.Errorf("container %q: envFrom is not supported by airflow-tf-node", c.Name)
	}
	hostname := pod.Spec.Hostname
	if hostname == "" {
		hostname = pod.Name
	}
	vars := map[string]string{
		"PATH":     image.Path + "/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOSTNAME": hostname,
		"HOME":     "/",
	}
	order := []string{"PATH", "HOSTNAME", "HOME"}
	for _, e := range c.Env {
		var value string
		switch {
		case e.ValueFrom == nil:
			value = Expand(e.Value, vars)
		case e.ValueFrom.FieldRef != nil:
			v, err := FieldValue(pod, e.ValueFrom.FieldRef.FieldPath, podIP, hostIP)
			if err != nil {
				return nil, fmt.Errorf("container %q, env %s: %w", c.Name, e.Name, err)
			}
			value = v
		default:
			return nil, fmt.Errorf("container %q, env %s: only values and fieldRefs are supported by airflow-tf-node", c.Name, e.Name)
		}
		if _, seen := vars[e.Name]; !seen {
			order = append(order, e.Name)
		}
		vars[e.Name] = value
	}
	env := make([]string, len(order))
	for i, name := range order {
		env[i] = name + "=" + vars[name]
	}
	return env, nil
}

// Argv is the process's argument vector: command (or the image's entrypoint) then args, with
// $(VAR) expanded from its environment.
func Argv(c *corev1.Container, image Image, env []string) ([]string, error) {
	vars := map[string]string{}
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		vars[name] = value
	}
	argv := append([]string{}, c.Command...)
	if len(argv) == 0 {
		argv = append(argv, image.Entrypoint...)
	}
	argv = append(argv, c.Args...)
	if len(argv) == 0 {
		return nil, fmt.Errorf("container %q has no command and its image no entrypoint", c.Name)
	}
	for i := range argv {
		argv[i] = Expand(argv[i], vars)
	}
	return argv, nil
}

// Expand replaces $(NAME) by the variable's value as Kubernetes does: $$ escapes a $, an
// unknown name is left as it is.
func Expand(s string, vars map[string]string) string {
	var out strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			out.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			out.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				out.WriteString(s[i:])
				return out.String()
			}
			name := s[i+2 : i+2+end]
			if value, ok := vars[name]; ok {
				out.WriteString(value)
			} else {
				out.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			out.WriteByte('$')
		}
	}
	return out.String()
}

// Terminated is the container state of a process that ended with status: its exit code, or
// 128 + the signal that killed it (137 for SIGKILL); reason Completed or Error (this node
// cannot tell an OOM kill from any other SIGKILL, so it never says OOMKilled).
func Terminated(status syscall.WaitStatus) (int32, string) {
	code := int32(status.ExitStatus())
	if status.Signaled() {
		code = 128 + int32(status.Signal())
	}
	if code == 0 {
		return 0, "Completed"
	}
	return code, "Error"
}

// Restarts says whether a container that exited with code restarts under the pod's policy.
func Restarts(policy corev1.RestartPolicy, code int32) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	}
	return true
}

// Phase is the pod's phase from its containers' states, as the kubelet computes it once
// nothing restarts: Succeeded when every container exited 0, Failed when one did not,
// Pending while one waits before its first start, else Running.
func Phase(statuses []corev1.ContainerStatus, done bool) corev1.PodPhase {
	if done {
		for _, s := range statuses {
			if s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
				return corev1.PodFailed
			}
		}
		return corev1.PodSucceeded
	}
	for _, s := range statuses {
		if s.State.Waiting != nil && s.LastTerminationState.Terminated == nil && s.RestartCount == 0 {
			return corev1.PodPending
		}
	}
	return corev1.PodRunning
}

// TerminationMessage is what the kubelet puts in a terminated container's status message:
// the file the container wrote at its terminationMessagePath, or, with FallbackToLogsOnError
// and a failure, the last 80 lines (at most 2 KiB) of its log; at most 4 KiB in all.
func TerminationMessage(c *corev1.Container, file, logFile string, code int32) string {
	data, _ := os.ReadFile(file)
	if len(data) == 0 && code != 0 && c.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError {
		logs, _ := os.ReadFile(logFile)
		lines := strings.SplitAfter(string(logs), "\n")
		if lines[len(lines)-1] == "" {
			lines = lines[:len(lines)-1]
		}
		if len(lines) > 80 {
			lines = lines[len(lines)-80:]
		}
		data = []byte(strings.Join(lines, ""))
		if len(data) > 2048 {
			data = data[len(data)-2048:]
		}
	}
	if len(data) > 4096 {
		data = data[len(data)-4096:]
	}
	return string(data)
}
