package main

// The pods' nameserver: an address on the bridge (inside the bridge's network namespace),
// relaying DNS over UDP and TCP to the cluster DNS on the host's loopback. Pods reach the
// cluster DNS, and nothing else of the host.

import (
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// inNamespace runs listen with the calling thread in the network namespace at path (sockets
// stay in the namespace they were made in).
func inNamespace(path string, listen func() error) error {
	runtime.LockOSThread()
	own, err := os.Open(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer own.Close()
	target, err := os.Open(path)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", path, err)
	}
	listenErr := listen()
	if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("back to the host's network namespace: %w", err) // the thread stays locked, and exits
	}
	runtime.UnlockOSThread()
	return listenErr
}

// RelayDNS listens on addr:53 in the bridge's namespace and relays each query to upstream.
func (n *Network) RelayDNS(addr, upstream string) error {
	if err := ip("-n", n.bridgeNS(), "addr", "add", addr+"/24", "dev", "br0"); err != nil {
		return err
	}
	var udp net.PacketConn
	var tcp net.Listener
	err := inNamespace("/run/netns/"+n.bridgeNS(), func() error {
		var err error
		if udp, err = net.ListenPacket("udp4", addr+":53"); err != nil {
			return err
		}
		tcp, err = net.Listen("tcp4", addr+":53")
		return err
	})
	if err != nil {
		return err
	}
	go func() {
		buf := make([]byte, 65535)
		for {
			size, from, err := udp.ReadFrom(buf)
			if err != nil {
				return
			}
			query := append([]byte{}, buf[:size]...)
			go func() {
				conn, err := net.Dial("udp", upstream)
				if err != nil {
					return
				}
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := conn.Write(query); err != nil {
					return
				}
				answer := make([]byte, 65535)
				if size, err := conn.Read(answer); err == nil {
					_, _ = udp.WriteTo(answer[:size], from)
				}
			}()
		}
	}()
	go func() {
		for {
			client, err := tcp.Accept()
			if err != nil {
				return
			}
			go func() {
				defer client.Close()
				server, err := net.DialTimeout("tcp", upstream, 5*time.Second)
				if err != nil {
					return
				}
				defer server.Close()
				go func() { _, _ = io.Copy(server, client) }()
				_, _ = io.Copy(client, server)
			}()
		}
	}()
	return nil
}
