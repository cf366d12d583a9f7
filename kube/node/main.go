// Command airflow-tf-node is a Kubernetes node whose pods run as local processes: the node
// of the private plane of scripts/kube (`up --node`), so that Jobs made by the Kubernetes
// backend really run, on this machine, without a container runtime.
//
// virtual-kubelet's node library does what a kubelet does towards the API server: the Node
// object and its lease, the pods bound to the node, their status, graceful deletion, and the
// kubelet HTTP API (container logs for `kubectl logs`). The provider here runs the pods.
//
// What it does differently from the real kubelet:
//   - No images and no root filesystem of the container's own: an image name stands for a
//     local environment (a table given with --images; a directory whose bin/ goes first on
//     PATH). An image not in the table is refused as an image that cannot be pulled is
//     (ErrImagePull, and an event). The processes see the host's files, except for what the
//     pod mounts (bind mounts in a mount namespace of the process's own), /etc/hosts,
//     /etc/resolv.conf and a /dev of its own holding the termination-log file. Mount points
//     missing on the host are made there (empty) while a pod uses them.
//   - No cgroups: no resource limits are enforced, and a SIGKILL is never told to be an OOM
//     kill (reason Error, exit code 137).
//   - Namespaces: network (one per pod, on a bridge inside a network namespace of this node:
//     pods reach each other, nothing leaves it; the bridge's first address relays DNS to the
//     cluster DNS given with --cluster-dns, which is all of the host pods can reach), mount and
//     UTS per process; no PID, IPC or user namespace. runAsUser/runAsGroup/fsGroup become the
//     process's uid, gid and groups; leaving uid 0 drops every capability (the manifests drop
//     ALL anyway); runAsNonRoot refuses uid 0. seccomp profiles and allowPrivilegeEscalation
//     are not applied.
//   - Processes run in a process group of their own, which is signalled (SIGTERM, then SIGKILL
//     after the grace period); restarts back off from --restart-backoff as the kubelet's do.
//   - Probes: exec startup and liveness probes only (others count as passing; readiness
//     follows the startup probe). Init containers, sidecars, envFrom, Secret/ConfigMap env
//     values, exec/attach/port-forward and stats are not supported.
//   - Volumes: hostPath, claims bound to hostPath or local volumes, emptyDir (a directory),
//     secret, configMap and projected (service account token) volumes, written once.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "_sandbox" {
		err := runSandbox(os.Args[2])
		fmt.Fprintf(os.Stderr, "airflow-tf-node: cannot start the container's process: %v\n", err)
		os.Exit(128)
	}
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "airflow-tf-node: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the node's credentials")
	name := flag.String("node-name", "airflow-tf-node", "the Node's name")
	listen := flag.String("listen", "127.0.0.1:10250", "address of the kubelet API (the Node's InternalIP and port)")
	cert := flag.String("tls-cert", "", "serving certificate of the kubelet API")
	key := flag.String("tls-key", "", "its key")
	clientCA := flag.String("client-ca", "", "CA of the client certificates the kubelet API accepts (the API server's)")
	imagesFile := flag.String("images", "", `image table (JSON file): {"image": "/prefix" | {"path": "/prefix", "entrypoint": [...]}}`)
	state := flag.String("state-dir", "", "directory for the pods' logs and files")
	prefix := flag.String("netns-prefix", "aftf", "prefix of the network namespaces this node makes")
	subnet := flag.String("pod-subnet", "10.244.0.0/24", "the pods' addresses (a /24)")
	clusterDNS := flag.String("cluster-dns", "", "the cluster DNS (host:port on this host), relayed to the pods "+
		"from the bridge's first address; without it the pods have no nameserver")
	domain := flag.String("cluster-domain", "cluster.local", "the cluster's DNS domain")
	backoff := flag.Duration("restart-backoff", 10*time.Second, "first delay before a container restarts (doubled each time)")
	flag.Parse()
	if *cert == "" || *key == "" || *clientCA == "" || *imagesFile == "" || *state == "" {
		return fmt.Errorf("--tls-cert, --tls-key, --client-ca, --images and --state-dir are required")
	}
	data, err := os.ReadFile(*imagesFile)
	if err != nil {
		return err
	}
	images, err := ParseImages(data)
	if err != nil {
		return err
	}
	_, cidr, err := net.ParseCIDR(*subnet)
	if err != nil || cidr.IP.To4() == nil {
		return fmt.Errorf("--pod-subnet %q: want an IPv4 /24", *subnet)
	}
	ones, _ := cidr.Mask.Size()
	if ones != 24 {
		return fmt.Errorf("--pod-subnet %q: want a /24", *subnet)
	}
	hostIP, portText, err := net.SplitHostPort(*listen)
	if err != nil {
		return err
	}
	port, _ := strconv.Atoi(portText)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	client, err := nodeutil.ClientsetFromEnv(*kubeconfig)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(*state, "pods"), 0o755); err != nil {
		return err
	}
	ip4 := cidr.IP.To4()
	network := &Network{Prefix: *prefix, Subnet: [3]byte{ip4[0], ip4[1], ip4[2]}}
	if err := network.Start(); err != nil {
		return err
	}
	defer network.Stop() //nolint:errcheck
	dns := ""
	if *clusterDNS != "" {
		dns = fmt.Sprintf("%d.%d.%d.1", ip4[0], ip4[1], ip4[2])
		if err := network.RelayDNS(dns, *clusterDNS); err != nil {
			return fmt.Errorf("the pods' nameserver: %w", err)
		}
	}

	events := record.NewBroadcaster()
	defer events.Shutdown()
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	recorder := events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "airflow-tf-node", Host: *name})
	provider := &Provider{Images: images, Net: network, Client: client, Events: recorder, StateDir: *state,
		Self: self, HostIP: hostIP, DNS: dns, ClusterDomain: *domain, Backoff: *backoff,
		pods: map[string]*podRun{}, mountpoints: map[string]int{}}

	mux := http.NewServeMux()
	n, err := nodeutil.NewNode(*name,
		func(cfg nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
			describe(cfg.Node, hostIP, int32(port))
			return provider, nil, nil
		},
		nodeutil.WithClient(client),
		nodeutil.WithTLSConfig(nodeutil.WithKeyPairFromPath(*cert, *key), nodeutil.WithCAFromPath(*clientCA)),
		nodeutil.AttachProviderRoutes(mux),
		func(cfg *nodeutil.NodeConfig) error {
			cfg.Handler, cfg.HTTPListenAddr, cfg.NumWorkers = mux, *listen, 2
			cfg.SkipDownwardAPIResolution = true // the provider resolves env itself (status.podIP is its)
			cfg.EventRecorder = recorder
			return nil
		})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		if err := n.Run(ctx); err != nil && ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "airflow-tf-node: %v\n", err)
			stop()
		}
	}()
	if err := n.WaitReady(ctx, 0); err != nil {
		provider.Shutdown(0)
		return err
	}
	fmt.Fprintf(os.Stderr, "airflow-tf-node: node %s ready, kubelet API on %s, pods on %s\n", *name, *listen, *subnet)
	<-ctx.Done()
	fmt.Fprintln(os.Stderr, "airflow-tf-node: stopping every pod")
	provider.Shutdown(5 * time.Second)
	<-n.Done()
	return nil
}

// describe fills the Node's status: its address and kubelet port, this machine's capacity.
func describe(n *corev1.Node, hostIP string, port int32) {
	n.Labels["kubernetes.io/os"] = runtime.GOOS
	n.Labels["kubernetes.io/arch"] = runtime.GOARCH
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: hostIP},
		{Type: corev1.NodeHostName, Address: n.Name}}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = port
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(memory(), resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(250, resource.DecimalSI),
	}
	n.Status.Capacity, n.Status.Allocatable = capacity, capacity
	n.Status.NodeInfo = corev1.NodeSystemInfo{OperatingSystem: runtime.GOOS, Architecture: runtime.GOARCH,
		KubeletVersion: "airflow-tf-node", ContainerRuntimeVersion: "airflow-tf-node://processes"}
}

func memory() int64 {
	data, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(data), "\n") {
		if fields := strings.Fields(line); len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(fields[1], 10, 64)
			return kb * 1024
		}
	}
	return 1 << 30
}
