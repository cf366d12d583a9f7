package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func testPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "g1-worker-0-abcde", Namespace: "ns1", UID: "u-1",
			Labels:      map[string]string{"app": "g1"},
			Annotations: map[string]string{"batch.kubernetes.io/job-completion-index": "3"}},
		Spec: corev1.PodSpec{NodeName: "airflow-tf-node", ServiceAccountName: "default", Hostname: "g1-worker-3"},
	}
}

func TestEnvironmentResolvesValuesReferencesAndFieldRefs(t *testing.T) {
	c := &corev1.Container{Name: "worker", Env: []corev1.EnvVar{
		{Name: "JOB_COMPLETION_INDEX", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
			FieldPath: "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
		{Name: "TASK", Value: "worker-$(JOB_COMPLETION_INDEX)"},
		{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "NS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
		{Name: "LITERAL", Value: "$$(TASK) $(UNKNOWN)"},
		{Name: "HOME", Value: "/home/u"},
	}}
	env, err := Environment(testPod(), c, Image{Path: "/venv"}, "10.244.0.7", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"PATH=/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOSTNAME=g1-worker-3", "HOME=/home/u", "JOB_COMPLETION_INDEX=3", "TASK=worker-3",
		"POD_IP=10.244.0.7", "NS=ns1", "LITERAL=$(TASK) $(UNKNOWN)"}
	if !reflect.DeepEqual(env, want) {
		t.Fatalf("env\n got %q\nwant %q", env, want)
	}
}

func TestEnvironmentRefusesWhatThisNodeCannotResolve(t *testing.T) {
	for _, c := range []*corev1.Container{
		{Name: "a", Env: []corev1.EnvVar{{Name: "S", ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{Key: "k"}}}}},
		{Name: "b", EnvFrom: []corev1.EnvFromSource{{}}},
		{Name: "c", Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
			FieldPath: "spec.nonsense"}}}}},
	} {
		if _, err := Environment(testPod(), c, Image{Path: "/venv"}, "", ""); err == nil {
			t.Errorf("container %s: no error", c.Name)
		}
	}
}

func TestFieldValueLabelsAndAnnotations(t *testing.T) {
	pod := testPod()
	for path, want := range map[string]string{
		"metadata.labels['app']":  "g1",
		"metadata.labels['none']": "",
		"metadata.labels":         `app="g1"`,
		"metadata.uid":            "u-1",
		"spec.nodeName":           "airflow-tf-node",
		"status.hostIP":           "127.0.0.1",
	} {
		got, err := FieldValue(pod, path, "10.244.0.2", "127.0.0.1")
		if err != nil || got != want {
			t.Errorf("%s: got %q, %v; want %q", path, got, err, want)
		}
	}
}

func TestArgvCommandArgsAndEntrypoint(t *testing.T) {
	env := []string{"TASK=worker-3"}
	got, err := Argv(&corev1.Container{Command: []string{"python", "-m", "x"}, Args: []string{"--task", "$(TASK)"}}, Image{}, env)
	if err != nil || !reflect.DeepEqual(got, []string{"python", "-m", "x", "--task", "worker-3"}) {
		t.Errorf("command+args: %q %v", got, err)
	}
	got, err = Argv(&corev1.Container{Args: []string{"--help"}}, Image{Entrypoint: []string{"airflow-tf"}}, env)
	if err != nil || !reflect.DeepEqual(got, []string{"airflow-tf", "--help"}) {
		t.Errorf("entrypoint+args: %q %v", got, err)
	}
	if _, err := Argv(&corev1.Container{Name: "x"}, Image{}, env); err == nil {
		t.Error("no command and no entrypoint: no error")
	}
}

func TestImageTable(t *testing.T) {
	images, err := ParseImages([]byte(`{"airflow-tf-training:0.1.0": "/venv",
		"python": {"path": "/usr", "entrypoint": ["python3"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	for ref, want := range map[string]string{
		"airflow-tf-training:0.1.0": "/venv", "docker.io/library/python:latest": "/usr", "python": "/usr"} {
		image, ok := images.Lookup(ref)
		if !ok || image.Path != want {
			t.Errorf("%s: got %+v %v, want %s", ref, image, ok, want)
		}
	}
	for _, ref := range []string{"airflow-tf-training:0.2.0", "registry.example.com/airflow-tf-training:0.1.0", "python:3"} {
		if _, ok := images.Lookup(ref); ok {
			t.Errorf("%s found", ref)
		}
	}
	for _, bad := range []string{`[]`, `{"x": "relative/path"}`, `{"x": 3}`} {
		if _, err := ParseImages([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func TestTerminatedExitCodesAndSignals(t *testing.T) {
	for _, tc := range []struct {
		status syscall.WaitStatus
		code   int32
		reason string
	}{
		{0, 0, "Completed"},
		{3 << 8, 3, "Error"},
		{syscall.WaitStatus(syscall.SIGKILL), 137, "Error"}, // never OOMKilled: this node cannot tell
		{syscall.WaitStatus(syscall.SIGTERM), 143, "Error"},
	} {
		code, reason := Terminated(tc.status)
		if code != tc.code || reason != tc.reason {
			t.Errorf("%#x: got %d %s, want %d %s", int(tc.status), code, reason, tc.code, tc.reason)
		}
	}
}

func TestRestartsAndPhase(t *testing.T) {
	if Restarts(corev1.RestartPolicyNever, 1) || !Restarts(corev1.RestartPolicyOnFailure, 1) ||
		Restarts(corev1.RestartPolicyOnFailure, 0) || !Restarts(corev1.RestartPolicyAlways, 0) {
		t.Error("restart policy")
	}
	terminated := func(code int32) corev1.ContainerStatus {
		return corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}
	}
	waiting := corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull"}}}
	backoff := corev1.ContainerStatus{RestartCount: 1, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}
	running := corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	for _, tc := range []struct {
		statuses []corev1.ContainerStatus
		done     bool
		want     corev1.PodPhase
	}{
		{[]corev1.ContainerStatus{terminated(0), terminated(0)}, true, corev1.PodSucceeded},
		{[]corev1.ContainerStatus{terminated(0), terminated(3)}, true, corev1.PodFailed},
		{[]corev1.ContainerStatus{waiting}, true, corev1.PodFailed},
		{[]corev1.ContainerStatus{waiting}, false, corev1.PodPending},
		{[]corev1.ContainerStatus{backoff}, false, corev1.PodRunning},
		{[]corev1.ContainerStatus{running, terminated(0)}, false, corev1.PodRunning},
	} {
		if got := Phase(tc.statuses, tc.done); got != tc.want {
			t.Errorf("%+v done=%v: got %s, want %s", tc.statuses, tc.done, got, tc.want)
		}
	}
}

func TestTerminationMessage(t *testing.T) {
	dir := t.TempDir()
	file, logFile := filepath.Join(dir, "termination-log"), filepath.Join(dir, "log")
	var logs strings.Builder
	for i := 0; i < 100; i++ {
		logs.WriteString("line\n")
	}
	logs.WriteString("the cause\n")
	if err := os.WriteFile(logFile, []byte(logs.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	fallback := &corev1.Container{TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError}
	got := TerminationMessage(fallback, file, logFile, 1)
	if !strings.HasSuffix(got, "the cause\n") || strings.Count(got, "\n") != 80 {
		t.Errorf("fallback to the log's last 80 lines: %q", got)
	}
	if got := TerminationMessage(fallback, file, logFile, 0); got != "" {
		t.Errorf("success falls back to nothing: %q", got)
	}
	if got := TerminationMessage(&corev1.Container{}, file, logFile, 1); got != "" {
		t.Errorf("policy File: %q", got)
	}
	if err := os.WriteFile(file, []byte("written by the process"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := TerminationMessage(fallback, file, logFile, 1); got != "written by the process" {
		t.Errorf("file first: %q", got)
	}
}

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "1"}
	for in, want := range map[string]string{"$(A)": "1", "$$(A)": "$(A)", "$(B)": "$(B)", "x$": "x$",
		"$A": "$A", "$(A": "$(A", "a$(A)b$(A)": "a1b1"} {
		if got := Expand(in, vars); got != want {
			t.Errorf("%q: got %q, want %q", in, got, want)
		}
	}
}
