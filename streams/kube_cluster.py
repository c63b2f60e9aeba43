"""The real Kubernetes control plane on free loopback ports: etcd, kube-apiserver and Kwok.

The binaries come from `make k8s` (infra/k8s/install.sh builds them with the Go toolchain from
the Go module proxy into .cache/k8s/<version>/bin, or the folder named by KOORDSTREAM_K8S_DIR);
Kwok's CRDs and stock Stage files from `make kwok-stages` (.cache/kwok/<version>); Koordinator's
CRDs (Reservation, PodGroup, ElasticQuota) from `make koordinator-crds`
(.cache/koordinator/<version>/crd); agent-sandbox's (SandboxTemplate, SandboxWarmPool,
SandboxClaim) from `make agent-sandbox-crds` (.cache/agent-sandbox/<version>/crd). Versions:
infra/k8s/versions.env.

`ControlPlane` starts, in a folder the caller owns (a temporary one by default, removed by
`stop()`): etcd (its data in `etcd/`, fsync off: a test cluster), kube-apiserver with a serving
certificate and a service-account signing key generated at start (`streams.pki`), a static
admin token (group system:masters), AlwaysAllow or RBAC authorization, and the admission
plugins that wait for a controller-manager off (none runs here: ServiceAccount, which needs
default service accounts, and TaintNodesByCondition, whose not-ready taint only the node
lifecycle controller takes off); then Koordinator's and agent-sandbox's CRDs, Kwok's Stage CRD and the chosen stock stages (with
`extra_stages`, the caller's Stage resources too, each replacing a stock one of its name), and Kwok
managing the nodes annotated `kwok.x-k8s.io/node: fake` (`kwok_options`: the options of a
KwokConfiguration file it is given, such as its stage workers' parallelism). It writes an admin kubeconfig
(`kubeconfig`). Every process is tied to this one (it dies with it) and stopped on a clean
exit; their logs are in `logs/`.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import yaml

from schemas.kube import node_manifest
from schemas.quantity import to_canonical
from schemas.records import GpuDevice, Node, ResourceList, Taint
from streams.broker import free_port
from streams.kubeapi import KubeApi, Limits, Resources
from streams.pki import make_pki
from streams.process import spawn_tied, stop

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ROOT / "infra" / "k8s" / "versions.env"
K8S_DIR_ENV = "KOORDSTREAM_K8S_DIR"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# Kwok's stock stages a cluster gets by default: nodes become Ready at once (no heartbeat: no
# node controller runs here to mark them NotReady), pods run, Job pods complete, deleted pods go.
DEFAULT_STAGES = ("node/fast", "pod/fast")
KOORDINATOR_CRDS = ("scheduling.koordinator.sh_reservations.yaml", "scheduling.sigs.k8s.io_podgroups.yaml",
                    "scheduling.sigs.k8s.io_elasticquotas.yaml")
AGENT_SANDBOX_CRDS = tuple(f"extensions.agents.x-k8s.io_{plural}.yaml"
                           for plural in ("sandboxtemplates", "sandboxwarmpools", "sandboxclaims"))


class K8sNotInstalled(RuntimeError):
    """The control plane's binaries or manifests are not where they should be."""


def versions() -> dict[str, str]:
    out = {}
    for line in VERSIONS.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def k8s_dir() -> Path:
    """The folder of the built binaries; raises K8sNotInstalled, saying how to build them."""
    folder = Path(os.environ.get(K8S_DIR_ENV) or ROOT / ".cache" / "k8s" / versions()["KUBERNETES_VERSION"])
    missing = [b for b in ("kube-apiserver", "etcd", "kwok") if not (folder / "bin" / b).is_file()]
    if missing:
        raise K8sNotInstalled(f"{', '.join(missing)} not built in {folder / 'bin'}: run `make k8s` "
                              "(infra/k8s/install.sh: builds them with Go from the Go module proxy, once)")
    return folder


def kwok_dir() -> Path:
    folder = ROOT / ".cache" / "kwok" / versions()["KWOK_VERSION"]
    if not (folder / "stage").is_dir():
        raise K8sNotInstalled(f"Kwok's stock stages are not in {folder}: run `make kwok-stages`")
    return folder


def koordinator_crds() -> Path:
    folder = ROOT / ".cache" / "koordinator" / versions()["KOORDINATOR_VERSION"] / "crd"
    if not (folder / KOORDINATOR_CRDS[0]).is_file():
        raise K8sNotInstalled(f"Koordinator's CRDs are not in {folder}: run `make koordinator-crds`")
    return folder


def agent_sandbox_crds() -> Path:
    folder = ROOT / ".cache" / "agent-sandbox" / versions()["AGENT_SANDBOX_VERSION"] / "crd"
    if not all((folder / name).is_file() for name in AGENT_SANDBOX_CRDS):
        raise K8sNotInstalled(f"agent-sandbox's CRDs are not in {folder}: run `make agent-sandbox-crds`")
    return folder


def stage_documents(stages: Sequence[str]) -> list[dict[str, Any]]:
    """Kwok's stock Stage resources of the named kustomize folders (e.g. "pod/fast"), unchanged."""
    base = kwok_dir() / "stage"
    out = []
    for name in stages:
        folder = base / name
        listing = yaml.safe_load((folder / "kustomization.yaml").read_text())
        for resource in listing.get("resources", ()):
            out += [d for d in yaml.safe_load_all((folder / resource).read_text()) if d]
    return out


def stage_set(stock: Sequence[Mapping[str, Any]], extra: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The Stage resources a cluster gets: the stock ones, less those that one of `extra` (a
    scenario's own) replaces by name, then `extra` in its order."""
    names = {str((doc.get("metadata") or {}).get("name", "")) for doc in extra}
    return [doc for doc in stock if str((doc.get("metadata") or {}).get("name", "")) not in names] + list(extra)


def kubeconfig_text(server: str, ca_file: Path, token: str, user: str = "admin") -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "koordstream",
        "clusters": [{"name": "koordstream", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "koordstream", "context": {"cluster": "koordstream", "user": user}}],
    })


class ControlPlane:
    """See the module docstring."""

    def __init__(self, folder: str | Path | None = None, *, rbac: bool = False, kwok: bool = True,
                 stages: Sequence[str] = DEFAULT_STAGES, crds: bool = True, etcd_quota_gib: int = 8,
                 apiserver_args: Sequence[str] = (), extra_stages: Sequence[Mapping[str, Any]] = (),
                 kwok_options: Mapping[str, Any] | None = None) -> None:
        self._own_folder = folder is None
        self.folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="koordstream-k8s-"))
        self.rbac, self.kwok, self.stages, self.crds = rbac, kwok, tuple(stages), crds
        self.extra_stages = tuple(extra_stages)  # Stage resources of the caller's, after the stock ones
        self.kwok_options = dict(kwok_options or {})  # KwokConfiguration options (e.g. podPlayStageParallelism)
        self.etcd_quota_gib = etcd_quota_gib
        self.apiserver_args = tuple(apiserver_args)
        self.token = secrets.token_hex(16)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.port = 0
        self.etcd_port = 0
        self.started_s: dict[str, float] = {}  # what took how long to be ready
        self._apiserver_cmd: list[str] = []

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self.folder / "kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.folder / "pki" / "ca.crt"

    def _spawn(self, name: str, cmd: Sequence[str]) -> subprocess.Popen[bytes]:
        logs = self.folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as out:
            proc = spawn_tied(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs[name] = proc
        return proc

    def _check(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            tail = (self.folder / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")

    async def start(self, timeout_s: float = 120.0) -> None:
        bins = k8s_dir() / "bin"
        self.folder.mkdir(parents=True, exist_ok=True)
        pki = make_pki(self.folder / "pki")
        tokens = self.folder / "pki" / "tokens.csv"
        tokens.write_text(f'{self.token},admin,admin,"system:masters"\n')
        tokens.chmod(0o600)
        begin = time.monotonic()

        self.etcd_port, peer = free_port(), free_port()
        self._spawn("etcd", [
            str(bins / "etcd"), "--name", "koordstream", "--data-dir", str(self.folder / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"koordstream=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--quota-backend-bytes", str(self.etcd_quota_gib * 2**30), "--log-level", "warn",
        ])
        await self._wait("etcd", f"http://127.0.0.1:{self.etcd_port}/health", timeout_s)
        self.started_s["etcd"] = time.monotonic() - begin

        self.port = free_port()
        self._apiserver_cmd = [
            str(bins / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}", f"--token-auth-file={tokens}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}", f"--service-account-signing-key-file={pki.sa_key}",
            "--service-cluster-ip-range=10.96.0.0/16",
            f"--authorization-mode={'RBAC' if self.rbac else 'AlwaysAllow'}",
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition", "--endpoint-reconciler-type=none",
            f"--cert-dir={self.folder / 'pki'}", "--profiling=false", "--event-ttl=1h",
            *self.apiserver_args,
        ]
        self._spawn("kube-apiserver", self._apiserver_cmd)
        await self._wait("kube-apiserver", f"{self.server}/readyz", timeout_s)
        self.started_s["kube-apiserver"] = time.monotonic() - begin - self.started_s["etcd"]
        self.kubeconfig.write_text(kubeconfig_text(self.server, pki.ca_cert, self.token))

        if self.crds or self.kwok:
            async with self.api() as api:
                resources = Resources(api)
                documents = []
                if self.crds:
                    documents += [yaml.safe_load((koordinator_crds() / name).read_text()) for name in KOORDINATOR_CRDS]
                    documents += [yaml.safe_load((agent_sandbox_crds() / name).read_text())
                                  for name in AGENT_SANDBOX_CRDS]
                if self.kwok:
                    documents.append(yaml.safe_load((kwok_dir() / "crd" / "bases" / "kwok.x-k8s.io_stages.yaml")
                                                    .read_text()))
                for crd in documents:
                    await resources.apply(crd)
                for crd in documents:
                    await resources.established(crd)
                if self.kwok:
                    for stage in stage_set(stage_documents(self.stages), self.extra_stages):
                        await resources.apply(dict(stage))
        if self.kwok:
            self.start_kwok()
        self.started_s["total"] = time.monotonic() - begin

    def start_kwok(self) -> None:
        config: list[str] = []
        if self.kwok_options:
            path = self.folder / "kwok.yaml"
            path.write_text(yaml.safe_dump({"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
                                            "options": self.kwok_options}))
            config = [f"--config={path}"]
        self._spawn("kwok", [
            str(k8s_dir() / "bin" / "kwok"), f"--kubeconfig={self.kubeconfig}",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            "--enable-crds=Stage", "--node-lease-duration-seconds=0", "--cidr=10.0.0.1/16",
            "--node-ip=10.255.0.1", *config,
        ])

    async def _wait(self, name: str, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        context = ssl.create_default_context(cafile=str(self.ca_file)) if url.startswith("https") else None
        headers = {"Authorization": f"Bearer {self.token}"}
        async with aiohttp.ClientSession() as session:
            while True:
                self._check(name)
                try:
                    async with session.get(url, ssl=context if context else False, headers=headers,
                                           timeout=aiohttp.ClientTimeout(total=2)) as resp:
                        if resp.status == 200:
                            return
                except (TimeoutError, aiohttp.ClientError, OSError):
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} not ready at {url} after {timeout_s:.0f} s")
                await asyncio.sleep(0.2)

    def api(self, limits: Limits | None = None) -> KubeApi:
        """A client as the admin."""
        from kubernetes_asyncio.client import Configuration

        configuration = Configuration(host=self.server, api_key={"BearerToken": self.token},
                                      api_key_prefix={"BearerToken": "Bearer"})
        configuration.ssl_ca_cert = str(self.ca_file)
        return KubeApi(configuration, limits or Limits())

    async def apply_file(self, path: Path) -> None:
        """Every manifest of a (multi-document) YAML file, by server-side apply, as the admin."""
        async with self.api() as api:
            resources = Resources(api)
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    await resources.apply(doc)

    async def service_account_kubeconfig(self, namespace: str, name: str, path: Path,
                                         expiration_s: int = 86400) -> Path:
        """A kubeconfig at `path` that authenticates as service account `namespace/name` (a
        token from the TokenRequest API, valid `expiration_s`)."""
        async with self.api() as api:
            answer = await api.request(
                "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                      "spec": {"expirationSeconds": expiration_s}})
        path.write_text(kubeconfig_text(self.server, self.ca_file, answer["status"]["token"], user=name))
        path.chmod(0o600)
        return path

    def resident_mib(self) -> dict[str, float]:
        """Resident memory of each process (MiB), from /proc."""
        out = {}
        for name, proc in self.procs.items():
            try:
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out[name] = int(line.split()[1]) / 1024
            except OSError:
                pass
        return out

    def kill(self, name: str) -> None:
        """SIGKILL one process (a crash)."""
        proc = self.procs[name]
        proc.kill()
        proc.wait()

    async def restart_apiserver(self, timeout_s: float = 120.0) -> None:
        """Start kube-apiserver again, as it was started, on the same port (after `kill`, or
        killing it first): its etcd kept everything, so clients find the same objects and
        resourceVersions at the same address."""
        proc = self.procs.get("kube-apiserver")
        if proc is not None and proc.poll() is None:
            self.kill("kube-apiserver")
        self._spawn("kube-apiserver", self._apiserver_cmd)
        await self._wait("kube-apiserver", f"{self.server}/readyz", timeout_s)

    def stop(self) -> None:
        for name in ("kwok", "kube-apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                stop(proc, 10)
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    async def __aenter__(self) -> ControlPlane:
        try:
            await self.start()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.stop()


def kwok_node(name: str, cpu: str = "32", memory: str = "256Gi", pods: str = "110", gpus: int = 0,
              labels: dict[str, str] | None = None, taints: tuple[Taint, ...] = ()) -> dict[str, Any]:
    """A Node for Kwok to manage (its annotation), Ready once Kwok's node-initialize stage ran:
    the manifest of a Node record (`schemas.kube.node_manifest`), as the perf harness makes them."""
    allocatable = ResourceList({r: to_canonical(r, v, f"allocatable.{r}")
                                for r, v in (("cpu", cpu), ("memory", memory), ("pods", pods))})
    node = Node(name=name, labels={"type": "kwok", "kubernetes.io/hostname": name, **(labels or {})}, taints=taints,
                capacity=allocatable, allocatable=allocatable, gpus=tuple(GpuDevice(minor=i) for i in range(gpus)))
    return node_manifest(node, annotations={KWOK_NODE_ANNOTATION: "fake"})


async def cluster_up(folder: Path, nodes: int, rbac: bool, stopping: asyncio.Event, say: Any = print) -> None:
    """`koordstream cluster up`: the control plane with Kwok in `folder`, `nodes` Kwok nodes,
    the bridge's RBAC manifests and a kubeconfig for its service account; until `stopping`."""
    async with ControlPlane(folder, rbac=rbac) as cp:
        await cp.apply_file(ROOT / "infra" / "k8s" / "rbac.yaml")
        bridge = await cp.service_account_kubeconfig("koordstream-system", "koordstream-bridge",
                                                     folder / "bridge.kubeconfig")
        async with cp.api() as api:
            for i in range(nodes):
                await api.request("POST", "/api/v1/nodes", body=kwok_node(f"kwok-node-{i}"))
        say(f"koordstream cluster up: API server {cp.server} (Kubernetes {versions()['KUBERNETES_VERSION']}, "
            f"Kwok {versions()['KWOK_VERSION']}, {'RBAC' if rbac else 'AlwaysAllow'}), {nodes} Kwok nodes")
        say(f"  admin kubeconfig:  {cp.kubeconfig}   (kubectl --kubeconfig {cp.kubeconfig} get nodes)")
        say(f"  bridge kubeconfig: {bridge}   (koordstream bridge --kubeconfig {bridge} --bootstrap H:P)")
        say(f"  started in {cp.started_s['total']:.1f} s; logs in {folder / 'logs'}; Ctrl-C stops it")
        await stopping.wait()
