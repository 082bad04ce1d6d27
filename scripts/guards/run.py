#!/usr/bin/env python3
"""Removes each guard of guards.py in turn, runs the native tests (`cargo test --lib`, the
simulation at SIM_SCHEDULES schedules, 3 000 by default; a guard may name other cargo test
arguments, a kit suite), restores it, and prints which tests failed. Arguments: the indexes of the
guards to try (all by default). Results also go to target/guards.json. Exits 1 when a guard's
pattern is not in its file exactly once, when guards.py and the guards table of docs/testing.md
disagree, when no test misses a removed guard, or when the tests that miss it are none of those its
row of the table names.

`--check` checks the patterns and the table only (seconds, no build): what `scripts/test.sh` runs,
so a guard whose code moved, or a table that no longer says what the guards are, fails CI.
`--sample N` removes N guards, a different N for each commit (by the count of commits), so the CI
runs of successive commits go round them all: what `scripts/test.sh` runs after `--check`."""
import subprocess, sys, os, re, json, signal
# A run stopped from outside (a timeout's SIGTERM) still puts the guard back (the `finally` below).
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from guards import GUARDS
os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))


def table():
    """The guards table of docs/testing.md: {first cell: the names of the tests its row names}. A
    row that says "sim" names the simulation's tests."""
    text = open('docs/testing.md').read()
    text = text[text.index("### The contract's guards"):]
    text = text[:text.index('\n#', 4)] if '\n#' in text[4:] else text
    rows = {}
    for line in text.splitlines():
        if not line.startswith('| ') or line.startswith('| guard |'):
            continue
        cells = [c.strip() for c in line.strip().strip('|').split(' | ')]
        if len(cells) != 2:
            sys.exit(f'docs/testing.md: a guards row without two cells: {line}')
        tests = {name.rsplit('::', 1)[-1] for name in re.findall(r'`([^`]*::[^`]*)`', cells[1])}
        if re.search(r'\bsim\b', cells[1]):
            tests |= {'seeded_schedules_hold', 'regression_seeds_hold'}
        rows[cells[0]] = (tests, cells[1])
    return rows


def check():
    """Problems: stale patterns, and disagreements between guards.py and the table."""
    problems = []
    for i, (name, f, old, new, *args) in enumerate(GUARDS):
        n = open(f).read().count(old)
        if n != 1:
            problems.append(f'guard {i} ({name}): its pattern is found {n} times, not once')
    rows = table()
    names = {g[0] for g in GUARDS}
    for i, g in enumerate(GUARDS):
        if g[0] not in rows:
            problems.append(f'guard {i} ({g[0]}) has no row in the guards table of docs/testing.md')
    for row, (tests, cell) in rows.items():
        # A row shown by workerd alone (tests/e2e) is removed by hand: no guard can run it natively.
        if row not in names and not (cell.count('`tests/e2e/') and cell.count('`') == 2 * cell.count('`tests/e2e/')):
            problems.append(f'the row "{row}" of docs/testing.md has no guard in scripts/guards/guards.py')
    return problems, rows


problems, rows = check()
for p in problems:
    print(p)
if '--check' in sys.argv[1:]:
    print(f'{len(GUARDS)} guards, {len(rows)} rows, {len(problems)} problems')
    sys.exit(1 if problems else 0)
env = dict(os.environ, SIM_SCHEDULES=os.environ.get('SIM_SCHEDULES', '3000'))
results = []
args = sys.argv[1:]
only = [a for a in args if a.isdigit()]
if '--sample' in args:
    n = int(args[args.index('--sample') + 1])
    commits = subprocess.run(['git', 'rev-list', '--count', 'HEAD'], capture_output=True, text=True).stdout.strip()
    k = int(commits or '0')
    only = [str((k * n + i) % len(GUARDS)) for i in range(n)]
    print('guards sampled for this commit:', ' '.join(only), flush=True)
for i, (name, f, old, new, *args) in enumerate(GUARDS):
    if only and str(i) not in only:
        continue
    src = open(f).read()
    if src.count(old) != 1:
        results.append((i, name, 'PATTERN NOT FOUND', []))
        print(i, name, 'PATTERN NOT FOUND', flush=True)
        continue
    open(f, 'w').write(src.replace(old, new, 1))
    try:
        cmd = ['cargo', 'test'] + (args[0] if args else ['--lib'])
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600).stdout
    finally:
        open(f, 'w').write(src)
    failed = re.findall(r'^test (\S+) \.\.\. FAILED', out, re.M)
    seeds = re.findall(r'seed (\d+) broke an invariant: (.*)', out)
    named = rows.get(name, (set(), ''))[0]
    if not failed:
        verdict = 'MISSED'
    elif not {t.rsplit('::', 1)[-1] for t in failed} & named:
        verdict = 'CAUGHT BY TESTS ITS ROW DOES NOT NAME'
    else:
        verdict = 'caught'
    results.append((i, name, verdict, failed, seeds[:2]))
    print(i, name, '->', verdict, failed, seeds[:1], flush=True)
json.dump(results, open(os.path.join('target', 'guards.json'), 'w'), indent=1)
sys.exit(0 if not problems and all(r[2] == 'caught' for r in results) else 1)
