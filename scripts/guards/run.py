#!/usr/bin/env python3
"""Removes each guard of guards.py in turn, runs the native tests (`cargo test --lib`, the
simulation at SIM_SCHEDULES schedules, 3 000 by default; a guard may name other cargo test
arguments, a kit suite), restores it, and prints which tests failed: a guard no test misses is
listed with nothing after its arrow. Arguments: the indexes of the guards to try (all by default).
Results also go to target/guards.json. Exits 1 when a guard's pattern is not in its file exactly
once, or when no test misses a removed guard.

`--check` only checks the patterns (seconds, no build): what `scripts/test.sh` runs, so a guard whose
code moved fails CI instead of going quietly unchecked."""
import subprocess, sys, os, re, json
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from guards import GUARDS
os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
env = dict(os.environ, SIM_SCHEDULES=os.environ.get('SIM_SCHEDULES', '3000'))
results = []
only = [a for a in sys.argv[1:] if a != '--check']
if '--check' in sys.argv[1:]:
    stale = [(i, name, open(f).read().count(old)) for i, (name, f, old, new, *args) in enumerate(GUARDS)]
    stale = [s for s in stale if s[2] != 1]
    for i, name, n in stale:
        print(f'guard {i} ({name}): its pattern is found {n} times, not once')
    print(f'{len(GUARDS)} guards, {len(stale)} stale')
    sys.exit(1 if stale else 0)
for i, (name, f, old, new, *args) in enumerate(GUARDS):
    if only and str(i) not in only:
        continue
    src = open(f).read()
    if src.count(old) != 1:
        results.append((name, 'PATTERN NOT FOUND', []))
        print(name, 'PATTERN NOT FOUND', flush=True)
        continue
    open(f, 'w').write(src.replace(old, new, 1))
    try:
        cmd = ['cargo', 'test'] + (args[0] if args else ['--lib'])
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200).stdout
    finally:
        open(f, 'w').write(src)
    failed = re.findall(r'^test (\S+) \.\.\. FAILED', out, re.M)
    seeds = re.findall(r'seed (\d+) broke an invariant: (.*)', out)
    results.append((name, 'caught' if failed else 'MISSED', failed, seeds[:2]))
    print(name, '->', failed, seeds[:1], flush=True)
json.dump(results, open(os.path.join('target', 'guards.json'), 'w'), indent=1)
sys.exit(0 if all(r[1] == 'caught' for r in results) else 1)
