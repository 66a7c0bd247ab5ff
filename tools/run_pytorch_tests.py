#!/usr/bin/env python3
"""Run PyTorch's device-generic test files on the tpu device and print a per-file table.

    .venv/bin/python tools/run_pytorch_tests.py /path/to/pytorch/test [--files test_view_ops.py ...]

The test folder comes from a PyTorch source checkout that matches the installed torch
(nothing is downloaded). Each file runs in its own pytest process, from that folder, with
torch_tpu loaded as a pytest plugin (`-p torch_tpu`, so common_device_type sees the
PrivateUse1 backend when the file imports it) and PYTORCH_TESTING_DEVICE_ONLY_FOR=tpu (only
the tpu instantiations). Per test a --timeout (pytest-timeout, when installed), per file a
wall-clock limit (`timeout`); a file killed by its limit or by a signal is reported as
hung/aborted and counted from its verbose log. Results go to --out: <file>.log, <file>.xml.

Columns: passed / failed / errors / skipped, pass% over run tests, pass% without the
failures that name a dtype tpu does not support ("does not support dtype"), and
'hang/abort' (tests stopped by the per-test timeout; 'KILLED' or 'SIG<n>' for the file).
--groups N also prints the N most common failure messages per file."""
import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET

DEFAULT_FILES = ["test_view_ops.py", "test_indexing.py", "test_binary_ufuncs.py", "test_unary_ufuncs.py",
                 "test_reductions.py", "test_shape_ops.py", "test_ops.py"]
# test_ops.py is large: by default only TestCommon's out=/CPU-comparison/error/bool checks
DEFAULT_K = {"test_ops.py": "TestCommon and (test_out or test_compare_cpu or test_errors or test_non_standard_bool)"}
UNSUPPORTED = re.compile(r"does not support dtype")
# dtypes tpu does not support, as they appear in test ids (for logs cut short, which have no messages)
UNSUPPORTED_ID = re.compile(r"_(complex32|chalf)(_|\b)")


def has_pytest_timeout(python):
    return subprocess.run([python, "-c", "import pytest_timeout"], capture_output=True).returncode == 0


def run_file(args, name):
    tag = name[:-3]
    log, xml = os.path.join(args.out, tag + ".log"), os.path.join(args.out, tag + ".xml")
    for p in (log, xml):
        if os.path.exists(p):
            os.remove(p)
    cmd = ["timeout", "-s", "KILL", str(args.file_timeout), args.python, "-m", "pytest", "-p", "no:cacheprovider",
           "-p", "torch_tpu", "-v", "-rfE", "--junitxml=" + xml, name]
    if args.timeout and has_pytest_timeout(args.python):
        cmd.insert(cmd.index("-v"), f"--timeout={args.timeout}")
    k = args.k.get(name, DEFAULT_K.get(name)) if args.k else DEFAULT_K.get(name)
    if k:
        cmd += ["-k", k]
    env = dict(os.environ, PYTORCH_TESTING_DEVICE_ONLY_FOR="tpu", PYTORCH_PRINT_REPRO_ON_FAILURE="0")
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=args.test_dir, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    with open(log, "a") as f:
        f.write(f"\n# rc={rc}\n")
    return rc


def first_line(text):
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line[:160]
    return ""


def parse(args, name):
    tag = name[:-3]
    log, xml = os.path.join(args.out, tag + ".log"), os.path.join(args.out, tag + ".xml")
    counts = collections.Counter()
    messages = collections.Counter()
    unsupported = timeouts = 0
    rc = None
    text = open(log, errors="replace").read() if os.path.exists(log) else ""
    m = re.search(r"(?:^|\s)(?:# )?rc=(-?\d+)\s*$", text, re.M)
    if m:
        rc = int(m.group(1))
    if os.path.exists(xml) and os.path.getsize(xml) > 0:
        for case in ET.parse(xml).getroot().iter("testcase"):
            kind = "passed"
            for child in case:
                if child.tag in ("failure", "error"):
                    kind = "failed" if child.tag == "failure" else "errors"
                    msg = child.get("message") or first_line(child.text)
                    msg = re.sub(r"\s+", " ", msg)[:160]
                    messages[msg] += 1
                    if UNSUPPORTED.search(msg) or UNSUPPORTED.search(child.text or ""):
                        unsupported += 1
                    if "Timeout" in msg:
                        timeouts += 1
                elif child.tag == "skipped":
                    kind = "skipped"
            counts[kind] += 1
    else:  # killed before pytest wrote its report: count the verbose lines
        for m in re.finditer(r"::(\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", text):
            word = m.group(2)
            if word in ("FAILED", "ERROR") and UNSUPPORTED_ID.search(m.group(1)):
                unsupported += 1
            counts[{"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "XPASS": "passed"}.get(word, "skipped")] += 1
    return counts, messages, unsupported, timeouts, rc


def status(rc, timeouts, args):
    if rc is None:
        return "not run"
    if rc in (137, -signal.SIGKILL, 124):
        return "KILLED (file time limit)"
    if rc < 0 or rc > 128:
        return f"SIG{abs(rc) if rc < 0 else rc - 128}"
    return str(timeouts) if timeouts else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("test_dir", help="a PyTorch checkout's test/ folder")
    ap.add_argument("--files", nargs="*", default=DEFAULT_FILES)
    ap.add_argument("--out", default="/tmp/torch_tpu_pytorch_tests")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--timeout", type=int, default=60, help="seconds per test (pytest-timeout)")
    ap.add_argument("--file-timeout", type=int, default=3600, help="seconds per file")
    ap.add_argument("-k", action="append", default=[], metavar="FILE=EXPR", help="a -k expression for one file")
    ap.add_argument("--summarize-only", action="store_true", help="re-read the logs in --out, run nothing")
    ap.add_argument("--groups", type=int, default=0, help="print the N most common failure messages per file")
    args = ap.parse_args()
    args.k = dict(kv.split("=", 1) for kv in args.k)
    os.makedirs(args.out, exist_ok=True)
    rows, total = [], collections.Counter()
    for name in args.files:
        if not args.summarize_only:
            if not os.path.exists(os.path.join(args.test_dir, name)):
                print(f"{name}: not in {args.test_dir}", file=sys.stderr)
                continue
            run_file(args, name)
        counts, messages, unsupported, timeouts, rc = parse(args, name)
        ran = counts["passed"] + counts["failed"] + counts["errors"]
        pct = 100.0 * counts["passed"] / ran if ran else 0.0
        pct2 = 100.0 * counts["passed"] / (ran - unsupported) if ran - unsupported else 0.0
        rows.append((name, counts, pct, pct2, status(rc, timeouts, args), messages))
        total.update(counts)
        total["unsupported"] += unsupported
    print(f"{'file':24} {'passed':>7} {'failed':>7} {'errors':>7} {'skipped':>8} {'pass%':>6} {'w/o dt%':>8}  hang/abort")
    for name, c, pct, pct2, st, _ in rows:
        print(f"{name:24} {c['passed']:7} {c['failed']:7} {c['errors']:7} {c['skipped']:8} {pct:6.1f} {pct2:8.1f}  {st}")
    ran = total["passed"] + total["failed"] + total["errors"]
    if ran:
        print(f"{'total':24} {total['passed']:7} {total['failed']:7} {total['errors']:7} {total['skipped']:8} "
              f"{100.0 * total['passed'] / ran:6.1f} {100.0 * total['passed'] / max(1, ran - total['unsupported']):8.1f}")
    for name, _, _, _, _, messages in rows:
        if args.groups and messages:
            print(f"\n{name}:")
            for msg, n in messages.most_common(args.groups):
                print(f"  {n:5}  {msg}")


if __name__ == "__main__":
    main()
