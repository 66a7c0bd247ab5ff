"""The device owner (torch_tpu/owner.py, csrc/remote): one process opens the device under the
one-process rule (TORCH_TPU_EXCLUSIVE=1), others of its user attach to it (TORCH_TPU_OWNER) and
run torch on tpu unchanged; tensors are shared between them by handle; other users, garbage on
the socket and the owner's death are handled."""
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

REQ, REP = 0x31525454, 0x31505454  # csrc/remote/protocol.h


def _env(tmp_path, **kw):
    env = dict(os.environ, TORCH_TPU_EXCLUSIVE="1", XDG_RUNTIME_DIR=str(tmp_path), TORCH_TPU_CACHE_DIR="")
    env.update(kw)
    return env


def _start_owner(env, preexec_fn=None):
    proc = subprocess.Popen([sys.executable, "-m", "torch_tpu.owner"], env=env, stderr=subprocess.PIPE,
                            text=True, preexec_fn=preexec_fn)
    line = proc.stderr.readline()
    if "serves" not in line:
        proc.kill()
        pytest.fail(f"the owner did not start: {line}{proc.stderr.read()[-3000:]}")
    return proc, line.rsplit(" on ", 1)[1].strip()


def _stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def owner(tmp_path):
    env = _env(tmp_path)
    proc, sock = _start_owner(env)
    yield proc, sock, env
    _stop(proc)


def _run(code, env, timeout=180):
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


CLIENT = """
import torch, torch_tpu
torch.manual_seed({seed})
x = torch.randn(16, 8)
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
ref = m(x)
t = m.to("tpu")(x.to("tpu"))
torch.testing.assert_close(t.cpu(), ref, rtol=1e-2, atol=1e-2)
print("ok", torch.tpu.get_device_name(), torch_tpu._C.plugin_path().endswith("libtt_remote_pjrt.so"))
"""


def test_attached_processes_share_the_owners_device(owner):
    proc, sock, env = owner
    # under the one-process rule a plain process is refused, naming the owner and how to attach
    probe = "import torch\ntry:\n    torch.ones(1, device='tpu')\nexcept RuntimeError as e:\n    print(e)\n"
    refused = _run(probe, env)
    assert f"in use by process {proc.pid}" in refused and f"TORCH_TPU_OWNER={sock}" in refused
    # two attached processes at once (TORCH_TPU_OWNER=1: the default socket)
    attached = dict(env, TORCH_TPU_OWNER="1")
    clients = [subprocess.Popen([sys.executable, "-c", CLIENT.format(seed=s)], env=attached,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for s in (0, 1)]
    for c in clients:
        out, err = c.communicate(timeout=180)
        assert c.returncode == 0, err[-3000:]
        assert out.split()[0] == "ok" and out.split()[-1] == "True", out
    assert proc.poll() is None


SHARE = """
import pickle, sys, torch, torch_tpu, torch_tpu.owner as o
w = (torch.arange(24, dtype=torch.float32).reshape(4, 6) / 7).to("tpu")
v = w[1:, 2:]  # a view: shared as a view of the same storage
with open(sys.argv[1], "wb") as f:
    pickle.dump([o.share(w), o.share(v)], f)
print("shared", flush=True)
sys.stdin.readline()  # the other process has checked
print(repr(w.cpu().sum().item()))
"""

OPEN = """
import pickle, sys, torch, torch_tpu
m0 = torch_tpu.metrics.report()
with open(sys.argv[1], "rb") as f:
    hw, hv = pickle.load(f)
w, v = hw.open(), hv.open()
m1 = torch_tpu.metrics.report()
print("bytes", m1["h2d_bytes"] - m0["h2d_bytes"], m1["d2h_bytes"] - m0["d2h_bytes"])
want = torch.arange(24, dtype=torch.float32).reshape(4, 6) / 7
print("equal", torch.equal(w.cpu(), want), torch.equal(v.cpu(), want[1:, 2:]), v.shape == (3, 4))
w.mul_(2)  # this process's update: a new buffer here, the exporter's is untouched
print("updated", torch.equal(w.cpu(), want * 2))
try:
    type(hw)("0" * 64, hw.sizes, hw.strides, 0, hw.dtype, hw.nbytes, hw.storage_dtype, 0).open()
except RuntimeError as e:
    print("bad token:", e)
"""


def test_a_tensor_shared_by_handle_is_the_same_device_memory(owner, tmp_path):
    _, _, env = owner
    attached = dict(env, TORCH_TPU_OWNER="1")
    handle = str(tmp_path / "handles.pkl")
    exporter = subprocess.Popen([sys.executable, "-c", SHARE, handle], env=attached, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert exporter.stdout.readline().strip() == "shared", exporter.stderr.read()[-3000:]
        out = _run(OPEN.replace("sys.argv[1]", repr(handle)), attached)
        assert "bytes 0 0" in out  # opening moves no byte through host memory
        assert "equal True True True" in out and "updated True" in out
        assert "bad token: no shared buffer for this token" in out
        exporter.stdin.write("\n")
        exporter.stdin.flush()
        rest, err = exporter.communicate(timeout=60)
        assert exporter.returncode == 0, err[-3000:]
        assert float(rest.strip()) == pytest.approx(sum(range(24)) / 7, rel=1e-6)
    finally:
        exporter.kill()
    with open(handle, "rb") as f:  # the handle pickles: torch.dtype and plain fields
        assert pickle.load(f)[0].dtype.is_floating_point


def _connect(sock):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(sock)
    return s


def _reply(s):
    head = b""
    while len(head) < 16:
        chunk = s.recv(16 - len(head))
        if not chunk:
            return None
        head += chunk
    magic, status, n = struct.unpack("<IIQ", head)
    assert magic == REP
    data = b""
    while len(data) < n:
        data += s.recv(n - len(data))
    return status, (data[8:].decode(errors="replace") if status else data)


def _request(s, op, payload):
    s.sendall(struct.pack("<IIQ", REQ, op, len(payload)) + payload)
    return _reply(s)


def test_garbage_and_hostile_messages_get_errors_and_the_owner_keeps_serving(owner):
    proc, sock, env = owner
    s = _connect(sock)
    status, _ = _reply(s)  # the greeting
    assert status == 0
    s.sendall(os.urandom(256))  # not our framing: an error, then the owner hangs up
    status, msg = _reply(s)
    assert status == 3 and "bad magic" in msg
    assert _reply(s) is None

    s = _connect(sock)
    _reply(s)
    assert _request(s, 999, b"")[0] == 3  # unknown request
    status, msg = _request(s, 7, struct.pack("<QQ", 12345, 4))  # another client's (or no) buffer
    assert status == 5 and "no buffer 12345" in msg
    status, msg = _request(s, 9, b"abc")  # truncated
    assert status == 3 and "malformed" in msg
    status, msg = _request(s, 6, struct.pack("<IQqqQ", 11, 1, -5, 0, 0))  # negative dims
    assert status == 3
    status, msg = _request(s, 6, struct.pack("<IQqqQ", 11, 1, 4, 0, 3) + b"abc")  # 3 bytes for 16
    assert status == 3 and "3 bytes for 16" in msg
    program = struct.pack("<I", 0) + struct.pack("<Q", 4) + b"mlir" + struct.pack("<Q", 10) + b"garbage!!!"
    status, msg = _request(s, 2, program)  # a program the compiler rejects
    assert status != 0 and "Compile failed" in msg
    # a header announcing a terabyte, then nothing: the owner only holds what arrives
    s.sendall(struct.pack("<IIQ", REQ, 6, 1 << 39) + b"x" * 1000)
    s.close()

    out = _run(CLIENT.format(seed=2), dict(env, TORCH_TPU_OWNER="1"))
    assert out.startswith("ok")
    assert proc.poll() is None


NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # readable by every user (this venv's interpreter may not be)

RAW_CLIENT = """
import os, socket, struct, sys
os.setgid(65534)
os.setuid(65534)
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect refused", e.errno)
    raise SystemExit
head = s.recv(16)
magic, status, n = struct.unpack("<IIQ", head)
data = b""
while len(data) < n:
    data += s.recv(n - len(data))
print("status", status, data[8:].decode(errors="replace"))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
                    reason="running a process as another user needs root (and a Python every user can run)")
def test_processes_of_another_user_are_refused():
    import shutil
    import tempfile

    runtime = tempfile.mkdtemp(prefix="tt_owner_")  # in /tmp: every user may traverse to it
    os.chmod(runtime, 0o755)
    env = _env(runtime)
    proc, sock = _start_owner(env)
    try:
        _check_other_user_refused(proc, sock, env)
    finally:
        _stop(proc)
        shutil.rmtree(runtime, ignore_errors=True)


def _check_other_user_refused(proc, sock, env):

    def as_nobody():
        out = subprocess.run([SYSTEM_PYTHON, "-c", RAW_CLIENT, sock], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout

    # the socket is 0600 in a 0700 directory: another user cannot even connect
    assert oct(os.stat(sock).st_mode & 0o777) == "0o600"
    assert oct(os.stat(os.path.dirname(sock)).st_mode & 0o777) == "0o700"
    assert as_nobody().startswith("connect refused")
    # with the permissions opened up (a misconfiguration), the owner still checks the peer's uid
    os.chmod(os.path.dirname(sock), 0o755)
    os.chmod(sock, 0o666)
    out = as_nobody()
    assert out.startswith("status 7") and f"uid {NOBODY} is not of the device owner's user" in out, out
    assert proc.poll() is None
    assert _run(CLIENT.format(seed=3), dict(env, TORCH_TPU_OWNER="1")).startswith("ok")


DIES = """
import os, signal, sys, time, torch
x = torch.ones(3, device="tpu") * 2
print("before", x.sum().item(), flush=True)
os.kill(int(sys.argv[1]), signal.SIGKILL)
time.sleep(1)
try:
    (x + 1).sum().item()
    print("no error")
except RuntimeError as e:
    print("error:", e)
"""


def test_the_owner_dying_gives_clients_a_clear_error_and_frees_the_device(owner):
    proc, sock, env = owner
    out = _run(DIES.replace("sys.argv[1]", str(proc.pid)), dict(env, TORCH_TPU_OWNER="1"))
    assert "before 6.0" in out
    assert f"the device owner (process {proc.pid}, socket {sock}) is gone" in out, out
    proc.wait(30)
    again = _run("import torch; print(torch.ones(2, device='tpu').sum().item())", env)  # the lock went with it
    assert again.strip() == "2.0"
