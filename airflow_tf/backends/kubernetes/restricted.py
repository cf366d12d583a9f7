"""Every pod the backend creates satisfies the Pod Security Standard ``restricted`` (the rules of
Kubernetes' Pod Security Admission, ``k8s.io/pod-security-admission/policy``, at its latest version),
checked when the manifests are rendered, before anything is created: a namespace labelled
``pod-security.kubernetes.io/enforce=restricted`` then admits every pod of a group, and a pod the
admission would refuse (which the Job controller would only report as FailedCreate events while the
group waits) is refused at launch naming the role, the container and the field.

The training container is built compliant (manifests' ``job.yaml.j2``). A container a user adds
(``init_containers``, ``sidecars``, the containers of a ``pod_template``) gets the two settings
``restricted`` requires and nobody needs to leave unset: ``allowPrivilegeEscalation: false`` and
``capabilities: {drop: [ALL]}``; what it sets itself is checked, never overridden. The pod-level
``runAsNonRoot``, ``runAsUser`` and ``seccompProfile`` the backend sets cover every container that sets
none of its own.

Stricter than the admission in one case: a pod in a user namespace (``hostUsers: false``) is not
let off the non-root rules.
"""

from __future__ import annotations

import copy

from airflow_tf.cluster import SpecError

from .pod_options import PodOptions

ALLOWED_VOLUMES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image", "persistentVolumeClaim",
                   "projected", "secret")
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start", "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem", "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"})
SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
SECCOMP_TYPES = ("RuntimeDefault", "Localhost")
APPARMOR_TYPES = ("RuntimeDefault", "Localhost")
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")


def harden(container: dict) -> dict:
    """A user's container with what ``restricted`` requires where it left the field unset."""
    context = dict(container.get("securityContext") or {})
    context.setdefault("allowPrivilegeEscalation", False)
    if "capabilities" not in context:
        context["capabilities"] = {"drop": ["ALL"]}
    elif isinstance(context["capabilities"], dict) and "drop" not in context["capabilities"]:
        context["capabilities"] = {**context["capabilities"], "drop": ["ALL"]}
    return {**container, "securityContext": context}


def origins(role: str, opts: PodOptions) -> dict[str, str]:
    """Each container's name -> where the user set it, for error messages."""
    named: dict[str, str] = {}
    template_spec = (opts.pod_template or {}).get("spec") or {}
    for key in ("initContainers", "containers"):
        for i, c in enumerate(template_spec.get(key) or []):
            if isinstance(c, dict) and isinstance(c.get("name"), str):
                named[c["name"]] = f"pod_template.spec.{key}[{i}] {c['name']!r}"
    for i, c in enumerate(opts.init_containers):
        named[c["name"]] = f"init_containers[{i}] {c['name']!r}"
    for i, c in enumerate(opts.sidecars):
        named[c["name"]] = f"sidecars[{i}] {c['name']!r}"
    named[role] = f"the training container {role!r}"
    return named


def restricted_pod(template: dict, role: str, opts: PodOptions, where: str) -> dict:
    """The pod template (metadata + spec) with the users' containers hardened (:func:`harden`), or a
    SpecError under ``where`` listing every field ``restricted`` forbids, by container."""
    pod = copy.deepcopy(template)
    spec = pod["spec"]
    main = spec["containers"][0]["name"]
    for key in _CONTAINER_LISTS:
        if spec.get(key):
            spec[key] = [c if c.get("name") == main and key == "containers" else harden(c) for c in spec[key]]
    problems = violations(pod, origins(role, opts), from_template=opts.pod_template is not None)
    if problems:
        raise SpecError(f"{where}: Pod Security Standard 'restricted' forbids this pod (a namespace enforcing it "
                        "refuses it; this backend creates no pod that it forbids):\n  " + "\n  ".join(problems))
    return pod


def violations(pod: dict, named: dict[str, str] | None = None, *, from_template: bool = False) -> list[str]:
    """Every field of ``pod`` (a Pod or pod template: metadata + spec) that ``restricted`` forbids, as
    ``<container or pod>: <field>: <value>; <what is allowed>``."""
    named = named or {}
    spec = pod.get("spec") or {}
    context = spec.get("securityContext") or {}
    where = "the pod" + (" (pod_template.spec)" if from_template else "")
    found = [f"{where}: {problem}" for problem in _pod_problems(pod, spec, context)]
    for key in _CONTAINER_LISTS:
        for i, c in enumerate(spec.get(key) or []):
            label = named.get(c.get("name"), f"spec.{key}[{i}] {c.get('name')!r}")
            found += [f"{label}: {problem}" for problem in _container_problems(c, context)]
    return found


def _pod_problems(pod: dict, spec: dict, context: dict) -> list[str]:
    problems = [f"spec.{key}: true; host namespaces are forbidden (unset or false)"
                for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    problems += [f"spec.securityContext.{p}" for p in _context_problems(context)]
    problems += _volume_problems(spec)
    problems += [f"spec.securityContext.sysctls {sysctl.get('name')!r}: not a safe sysctl; allowed: "
                 + ", ".join(sorted(SAFE_SYSCTLS))
                 for sysctl in context.get("sysctls") or [] if sysctl.get("name") not in SAFE_SYSCTLS]
    problems += [f"metadata.annotations {key}: {value!r}; allowed: runtime/default, localhost/*"
                 for key, value in ((pod.get("metadata") or {}).get("annotations") or {}).items()
                 if key.startswith(APPARMOR_ANNOTATION) and value != "runtime/default"
                 and not str(value).startswith("localhost/")]
    return problems


def _volume_problems(spec: dict) -> list[str]:
    problems = []
    for i, volume in enumerate(spec.get("volumes") or []):
        kinds = [k for k in volume if k != "name"]
        if not any(k in ALLOWED_VOLUMES for k in kinds):
            problems.append(f"spec.volumes[{i}] {volume.get('name')!r}: {'/'.join(kinds) or 'no source'} volumes are "
                            f"forbidden; allowed: {', '.join(ALLOWED_VOLUMES)}")
    return problems


def _context_problems(context: dict) -> list[str]:
    """What both a pod's and a container's securityContext may not set."""
    problems = []
    if context.get("runAsNonRoot") is False:
        problems.append("runAsNonRoot: false; must be true (or unset under a pod that sets it true)")
    if context.get("runAsUser") == 0:
        problems.append("runAsUser: 0 (root); must be a non-zero user id")
    seccomp = (context.get("seccompProfile") or {}).get("type")
    if seccomp is not None and seccomp not in SECCOMP_TYPES:
        problems.append(f"seccompProfile.type: {seccomp!r}; must be RuntimeDefault or Localhost")
    if ((context.get("windowsOptions") or {}).get("hostProcess")) is True:
        problems.append("windowsOptions.hostProcess: true; must be unset or false")
    selinux = context.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES:
        problems.append(f"seLinuxOptions.type: {selinux['type']!r}; allowed: {', '.join(t for t in SELINUX_TYPES if t)}")
    problems += [f"seLinuxOptions.{key}: {selinux[key]!r}; must be unset" for key in ("user", "role") if selinux.get(key)]
    apparmor = (context.get("appArmorProfile") or {}).get("type")
    if apparmor is not None and apparmor not in APPARMOR_TYPES:
        problems.append(f"appArmorProfile.type: {apparmor!r}; must be RuntimeDefault or Localhost")
    return problems


def _container_problems(c: dict, pod_context: dict) -> list[str]:
    context = c.get("securityContext") or {}
    return ([f"securityContext.{p}" for p in _context_problems(context)] + _privilege_problems(context, pod_context)
            + _capability_problems(context) + _host_endpoint_problems(c))


def _privilege_problems(context: dict, pod_context: dict) -> list[str]:
    """Privilege, escalation, root and seccomp: the container's own setting, else its pod's."""
    problems = []
    if context.get("privileged"):
        problems.append("securityContext.privileged: true; must be unset or false")
    if context.get("allowPrivilegeEscalation") is not False:
        problems.append(f"securityContext.allowPrivilegeEscalation: {context.get('allowPrivilegeEscalation')!r}; "
                        "must be false")
    if context.get("runAsNonRoot") is None and pod_context.get("runAsNonRoot") is not True:
        problems.append("securityContext.runAsNonRoot: unset under a pod that does not set it; must be true")
    if (context.get("seccompProfile") or {}).get("type") is None \
            and (pod_context.get("seccompProfile") or {}).get("type") is None:
        problems.append("securityContext.seccompProfile: unset under a pod that sets none; "
                        "must be RuntimeDefault or Localhost")
    if context.get("procMount") not in (None, "Default"):
        problems.append(f"securityContext.procMount: {context['procMount']!r}; must be unset or Default")
    return problems


def _capability_problems(context: dict) -> list[str]:
    capabilities = context.get("capabilities") or {}
    problems = []
    if "ALL" not in (capabilities.get("drop") or []):
        problems.append(f"securityContext.capabilities.drop: {capabilities.get('drop')!r}; must include ALL")
    added = [cap for cap in capabilities.get("add") or [] if cap != "NET_BIND_SERVICE"]
    if added:
        problems.append(f"securityContext.capabilities.add: {added!r}; only NET_BIND_SERVICE may be added")
    return problems


def _host_endpoint_problems(c: dict) -> list[str]:
    """Host ports, and probes or hooks aimed at another host."""
    problems = [f"ports[{j}].hostPort: {port['hostPort']}; host ports are forbidden (unset or 0)"
                for j, port in enumerate(c.get("ports") or []) if port.get("hostPort")]
    handlers = [(probe, c.get(probe)) for probe in _PROBES]
    handlers += [(f"lifecycle.{hook}", (c.get("lifecycle") or {}).get(hook)) for hook in ("postStart", "preStop")]
    problems += [f"{name}.{kind}.host: {(handler.get(kind) or {})['host']!r}; must be unset"
                 for name, handler in handlers if isinstance(handler, dict)
                 for kind in ("httpGet", "tcpSocket") if (handler.get(kind) or {}).get("host")]
    return problems
