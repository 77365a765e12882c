"""Check the output of a job of slurm/tests.sbatch or slurm/bench.sbatch.

Used by scripts/slurm_ci.sh (one node) and scripts/cluster_ci.sh (several):

    python scripts/slurm_job_check.py tests OUT NTASKS NODES "RANKS" RC
    python scripts/slurm_job_check.py bench OUT JSON NTASKS NODES CASES RC

OUT is the job's output file, NTASKS its tasks, NODES its nodes, RANKS the
rank counts the tests job ran, JSON the bench job's results, CASES its cases
(comma-separated), RC what ``sbatch --wait`` returned.  Prints one line per
finding; exit status 1 when something is wrong.
"""

import json
import os
import re
import sys

SUMMARY = re.compile(r"^=*\s*(?:(\d+):\s+)?=*\s*(\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed"
                     r"|warnings?|deselected)\b.*) in [\d.]+s")
BAD = re.compile(r"\b\d+ (failed|errors?)\b")


def read(path):
    """Return the text of ``path``, or None when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def check_tests(out, ntasks, nodes, ranks, rc):
    """Return the errors found in the output of a tests job."""
    text = read(out)
    if text is None:
        return [f"no output ({out})"]
    errors = []
    if rc != "0":
        errors.append(f"sbatch --wait returned {rc}")
    if not re.search(rf"^job \d+: {ntasks} tasks on {nodes} node\(s\)", text, re.M):
        errors.append(f"no 'job N: {ntasks} tasks on {nodes} node(s)' line")
    if "ALL PASSED" not in text.splitlines():
        errors.append("no 'ALL PASSED' line")
    # Sections: "== serial tests", "== MPI tests, N rank(s)", ...
    sections = re.split(r"^(== .*)$", text, flags=re.M)
    seen = {}
    for head, body in zip(sections[1::2], sections[2::2]):
        m = re.match(r"== MPI tests, (\d+) rank", head)
        key = int(m.group(1)) if m else head.strip()
        lines = [line for line in map(SUMMARY.match, body.splitlines()) if line]
        seen[key] = lines
        if not m and lines:
            print(f"tests job: {head.strip()[3:]}: {lines[-1].group(2)}")
        for line in lines:
            if BAD.search(line.group(2)) or "passed" not in line.group(2):
                errors.append(f"{head.strip()}: {line.group(0).strip()}")
        if m:
            n = key
            if f"COMM_WORLD size {n} == {n} tasks: ok" not in body:
                errors.append(f"{head.strip()}: no 'COMM_WORLD size {n} == {n} tasks: ok'")
            labels = sorted(int(line.group(1)) for line in lines if line.group(1) is not None)
            if labels != list(range(n)):
                errors.append(f"{head.strip()}: pytest summaries from ranks {labels}, "
                              f"expected one from each of 0..{n - 1}")
            else:
                print(f"tests job: {n} ranks, every rank: {lines[0].group(2)}")
    if not seen.get("== serial tests"):
        errors.append("no pytest summary for the serial tests")
    for n in ranks:
        if int(n) not in seen:
            errors.append(f"no section for {n} ranks")
    return errors


def check_bench(out, path, ntasks, nodes, cases, rc):
    """Return the errors found in the output and JSON of a bench job."""
    text = read(out) or ""
    errors = []
    if rc != "0":
        errors.append(f"sbatch --wait returned {rc}")
    if not re.search(rf"^job \d+: {ntasks} ranks on {nodes} node\(s\)", text, re.M):
        errors.append(f"no 'job N: {ntasks} ranks on {nodes} node(s)' line")
    if f"COMM_WORLD size {ntasks} == {ntasks} tasks: ok" not in text:
        errors.append(f"no 'COMM_WORLD size {ntasks} == {ntasks} tasks: ok' line")
    doc = None
    if not os.path.exists(path):
        errors.append(f"no bench JSON: {path} does not exist")
    else:
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            errors.append(f"no bench JSON: {exc}")
    if doc is not None:
        recs = doc.get("records") or []
        if doc.get("ranks") != ntasks:
            errors.append(f"JSON ranks {doc.get('ranks')} != {ntasks} tasks")
        if not recs:
            errors.append("JSON has no records")
        for r in recs:
            if r.get("correct") is not True:
                errors.append(f"record {r.get('case')}/{r.get('strategy')}: correct={r.get('correct')!r}")
            if r.get("ranks") != ntasks:
                errors.append(f"record {r.get('case')}/{r.get('strategy')}: ranks={r.get('ranks')!r}")
        got = {str(r.get("case")) for r in recs}
        for c in cases:
            if not any(g == c or g.startswith(c + "_") for g in got):
                errors.append(f"no record for case {c}")
        if not (doc.get("summary") or {}).get("all_correct"):
            errors.append("summary.all_correct is not true")
        if not errors:
            strategies = sorted({r.get("strategy") for r in recs})
            print(f"bench job: {len(recs)} records ({len(got)} cases x {len(strategies)} "
                  f"strategies), all correct at {ntasks} ranks on {nodes} node(s)")
    return errors


def main(argv):
    """Run the check named by ``argv[0]``; return the exit status."""
    if len(argv) == 6 and argv[0] == "tests":
        out, ntasks, nodes, ranks, rc = argv[1:]
        errors = check_tests(out, int(ntasks), int(nodes), ranks.split(), rc)
    elif len(argv) == 7 and argv[0] == "bench":
        out, path, ntasks, nodes, cases, rc = argv[1:]
        errors = check_bench(out, path, int(ntasks), int(nodes), cases.split(","), rc)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for e in errors:
        print(f"{argv[0]} job: ERROR: {e}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
