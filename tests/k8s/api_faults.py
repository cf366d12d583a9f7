"""A fault-injecting HTTPS proxy in front of the real API server, for the faults it will not
make on request: an HTTP 500 (or 410 Gone, or any status) on the next watch of pods, as an API
server that is restarting answers; a watch stream cut after a few events, as a load balancer
dropping the connection does. Everything else is the real API server's answer, byte for byte.

:class:`ApiFaults` listens on 127.0.0.1 only, serving a certificate of a throwaway CA made for it,
and forwards each request over TLS to the server of the kubeconfig it is given, checked against
that kubeconfig's CA. The client's ``Authorization`` header goes through unchanged, so the real
authorizer decides as before. :meth:`ApiFaults.write_kubeconfig` writes the kubeconfig pointing at
the proxy (its CA, the same user and namespace); :meth:`ApiFaults.requests` is what went through.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

from .plane import _write_kubeconfig

# Hop-by-hop headers are the proxy's own on each side; Accept-Encoding is dropped so that a watch
# comes back as plain lines of JSON, which the proxy counts.
_NOT_FORWARDED = {"host", "connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "accept-encoding"}
_VERB_OF_METHOD = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass
class Request:
    """One request through the proxy."""

    method: str
    path: str
    verb: str
    """As the API server's authorizer names it: get, list, watch, create, update, patch, delete,
    deletecollection."""
    resource: str
    """``pods``, ``pods/log``, ``jobs`` ... (empty for a path outside the resource API)."""
    namespace: str | None
    name: str | None
    query: dict[str, str]
    time: float
    """When the proxy received it (seconds since the epoch)."""
    code: int | None = None
    """The status the client got; None while a watch runs."""
    fault: str | None = None
    """What the proxy did instead of, or to, the API server's answer."""
    events: int = 0
    """The watch events passed on."""


@dataclass
class _Fault:
    verb: str
    resource: str
    times: int
    status: int | None  # answer this status instead of forwarding
    after_events: int | None  # else forward, and cut the stream after this many events
    message: str

    def describe(self) -> str:
        return f"HTTP {self.status}" if self.status is not None else f"cut after {self.after_events} event(s)"


def classify(method: str, path: str, query: dict[str, str]) -> tuple[str, str, str | None, str | None]:
    """The verb, resource, namespace and name of a request to the API server, as its authorizer
    reads them from ``/api/v1/...`` and ``/apis/GROUP/VERSION/...``."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        parts = parts[2:]
    elif parts[:1] == ["apis"]:
        parts = parts[3:]
    else:
        return method.lower(), "", None, None
    namespace = None
    if len(parts) >= 2 and parts[0] == "namespaces" and len(parts) != 2:
        namespace, parts = parts[1], parts[2:]
    if not parts:
        return method.lower(), "", namespace, None
    resource, name = parts[0], parts[1] if len(parts) > 1 else None
    if len(parts) > 2:
        resource += "/" + parts[2]
    if method == "GET":
        verb = "watch" if query.get("watch", "").lower() in ("1", "true") else ("get" if name else "list")
    elif method == "DELETE" and name is None:
        verb = "deletecollection"
    else:
        verb = _VERB_OF_METHOD.get(method, method.lower())
    return verb, resource, namespace, name


class ApiFaults:
    """The proxy in front of the API server of ``kubeconfig`` (its current context); its
    certificates are written into ``directory``."""

    def __init__(self, kubeconfig: Path, directory: Path) -> None:
        from kubernetes import config

        self.source = Path(kubeconfig)
        try:
            configuration = config.kube_config.Configuration()
            config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
            _, context = config.list_kube_config_contexts(config_file=str(kubeconfig))
        except (config.ConfigException, OSError) as e:
            raise ValueError(f"kubeconfig {kubeconfig}: cannot read it ({e}); give the kubeconfig of a namespace "
                             "(tests/k8s/plane.py's kube.kubeconfig)") from e
        upstream = urlsplit(configuration.host)
        if upstream.scheme != "https" or not upstream.hostname:
            raise ValueError(f"kubeconfig {kubeconfig}: server {configuration.host!r} is not an https:// URL; the "
                             "proxy forwards over TLS only")
        token = (configuration.auth_settings().get("BearerToken") or {}).get("value") or ""
        if not token.startswith("Bearer "):
            raise ValueError(f"kubeconfig {kubeconfig}: its user has no token; the proxy passes the client's bearer "
                             "token through, so give a kubeconfig whose user has 'token'")
        if not configuration.ssl_ca_cert:
            raise ValueError(f"kubeconfig {kubeconfig}: its cluster has no certificate-authority(-data); the proxy "
                             "checks the API server's certificate against it")
        self.token = token.removeprefix("Bearer ")
        self.namespace = (context.get("context") or {}).get("namespace") or "default"
        self._upstream = (upstream.hostname, upstream.port or 443)
        self._upstream_tls = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        directory.mkdir(parents=True, exist_ok=True)
        self.ca_file, cert, key = _throwaway_certificates(directory)
        serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        serving.load_cert_chain(cert, key)

        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._requests: list[Request] = []
        self._open: set[http.client.HTTPSConnection] = set()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        # The handshake happens in each connection's thread, not in the accepting one.
        self._server.socket = serving.wrap_socket(self._server.socket, server_side=True,
                                                  do_handshake_on_connect=False)
        self._thread = threading.Thread(target=self._server.serve_forever, name="api-faults", daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> ApiFaults:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for connection in list(self._open):  # ends the watches still running
                if connection.sock is not None:
                    connection.sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> ApiFaults:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig like the one given, but through the proxy."""
        _write_kubeconfig(path, SimpleNamespace(host=self.url, ssl_ca_cert=str(self.ca_file), verify_ssl=True),
                          self.token, self.namespace)
        return path

    # -- faults ------------------------------------------------------------------------------
    def fail_next(self, verb: str, resource: str, times: int = 1, status: int = 500,
                  message: str = "the API server is restarting") -> None:
        """Answer the next ``times`` requests of ``verb`` on ``resource`` with HTTP ``status``
        and a Kubernetes Status body, without forwarding them."""
        _check_times(times)
        if not 400 <= status <= 599:
            raise ValueError(f"status {status}: give an HTTP error status (400-599)")
        self._add(_Fault(verb, resource, times, status, None, message))

    def cut_next_watch(self, resource: str, after_events: int, times: int = 1) -> None:
        """Forward the next ``times`` watches of ``resource``, but close each connection after
        ``after_events`` events, with no end to the response."""
        _check_times(times)
        if after_events < 0:
            raise ValueError(f"after_events {after_events}: give a number of events from 0")
        self._add(_Fault("watch", resource, times, None, after_events, ""))

    def pending(self) -> int:
        """How many faults are yet to be made."""
        with self._lock:
            return sum(f.times for f in self._faults)

    def requests(self, verb: str | None = None, resource: str | None = None, since: float = 0.0) -> list[Request]:
        """The requests through the proxy, in the order received."""
        with self._lock:
            return [r for r in self._requests if (verb is None or r.verb == verb)
                    and (resource is None or r.resource == resource) and r.time >= since]

    def _add(self, fault: _Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def _take(self, request: Request) -> _Fault | None:
        with self._lock:
            self._requests.append(request)
            for fault in self._faults:
                if fault.verb == request.verb and fault.resource == request.resource:
                    fault.times -= 1
                    if not fault.times:
                        self._faults.remove(fault)
                    request.fault = fault.describe()
                    return fault
        return None

    # -- forwarding --------------------------------------------------------------------------
    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        split = urlsplit(handler.path)
        if not handler.path.startswith("/") or split.netloc:
            handler.send_error(400, "the proxy serves paths of the API server only")
            return
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        verb, resource, namespace, name = classify(handler.command, split.path, query)
        request = Request(handler.command, split.path, verb, resource, namespace, name, query, time.time())
        if handler.headers.get("Transfer-Encoding"):
            request.code = 411
            handler.send_error(411, "the proxy forwards request bodies with a Content-Length only")
            return
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        fault = self._take(request)
        if fault is not None and fault.status is not None:
            self._answer_status(handler, request, fault)
            return
        # A watch may stay quiet for as long as it asked to; stop() ends it.
        timeout = None if verb == "watch" else 60
        connection = http.client.HTTPSConnection(*self._upstream, context=self._upstream_tls, timeout=timeout)
        with self._lock:
            self._open.add(connection)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in _NOT_FORWARDED}
            connection.request(handler.command, handler.path, body=body or None, headers=headers)
            response = connection.getresponse()
            request.code = response.status
            if response.getheader("Content-Length") is not None or response.status in (204, 304):
                self._copy_whole(handler, response)
            else:
                self._copy_stream(handler, response, request, fault)
        except (OSError, http.client.HTTPException):
            handler.close_connection = True  # the client sees its connection end, as with the API server's
        finally:
            with self._lock:
                self._open.discard(connection)
            connection.close()

    @staticmethod
    def _send_head(handler: BaseHTTPRequestHandler, response: http.client.HTTPResponse, **set_headers: str) -> None:
        handler.send_response_only(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in _NOT_FORWARDED and key.lower() != "content-length":
                handler.send_header(key, value)
        for key, value in set_headers.items():
            handler.send_header(key.replace("_", "-"), value)
        handler.end_headers()

    def _copy_whole(self, handler: BaseHTTPRequestHandler, response: http.client.HTTPResponse) -> None:
        data = response.read()
        self._send_head(handler, response, Content_Length=str(len(data)))
        handler.wfile.write(data)
        handler.wfile.flush()

    def _copy_stream(self, handler: BaseHTTPRequestHandler, response: http.client.HTTPResponse, request: Request,
                     fault: _Fault | None) -> None:
        """A streamed answer (a watch, a followed log), chunk by chunk; a watch line by line,
        each line one event."""
        self._send_head(handler, response, Transfer_Encoding="chunked")
        while True:
            if fault is not None and request.events >= (fault.after_events or 0):
                handler.close_connection = True
                handler.connection.shutdown(socket.SHUT_RDWR)  # mid-response: the client's read fails
                return
            data = response.readline() if request.verb == "watch" else response.read1(65536)
            if not data:
                break
            if request.verb == "watch" and data.strip():
                request.events += 1
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            handler.wfile.flush()
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()

    @staticmethod
    def _answer_status(handler: BaseHTTPRequestHandler, request: Request, fault: _Fault) -> None:
        assert fault.status is not None
        reason = http.client.responses.get(fault.status, "Error")
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": fault.message, "reason": reason.replace(" ", ""), "code": fault.status}).encode()
        request.code = fault.status
        handler.send_response_only(fault.status, reason)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
        handler.wfile.flush()


def _check_times(times: int) -> None:
    if times < 1:
        raise ValueError(f"times {times}: give a number of requests from 1")


def _handler(proxy: ApiFaults) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive and chunked answers, as the API server's

        def handle_one_request(self) -> None:
            try:
                super().handle_one_request()
            except (ssl.SSLError, ConnectionError):
                self.close_connection = True

        def _forward(self) -> None:
            proxy._serve(self)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        def log_message(self, format: str, *args: object) -> None:  # the request log is ApiFaults.requests
            pass

    return Handler


def _throwaway_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA made for this proxy alone, and its serving certificate for 127.0.0.1: (CA, cert, key)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)

    def certificate(subject: str, key, issuer: str, signer, *, ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                decipher_only=False), critical=True)
        else:
            builder = (builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(
                ipaddress.ip_address("127.0.0.1"))]), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("api-faults test CA", ca_key, "api-faults test CA", ca_key, ca=True)
    leaf = certificate("api-faults proxy", key, "api-faults test CA", ca_key, ca=False)
    paths = directory / "api-faults-ca.crt", directory / "api-faults.crt", directory / "api-faults.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].touch(mode=0o600)
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths
