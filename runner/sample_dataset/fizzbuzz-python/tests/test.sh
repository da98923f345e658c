#!/bin/bash
# Writes /logs/verifier/reward.json: "reward" (1 only if every case passes) and "cases_passed"
# (the fraction of cases that passed).
mkdir -p /logs/verifier
python3 - <<'PY'
import importlib.util
import json

def expected(n):
    return ["FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0
            else str(i) for i in range(1, n + 1)]

cases = [1, 3, 5, 15, 31]
passed = 0
try:
    spec = importlib.util.spec_from_file_location("fizzbuzz", "/app/fizzbuzz.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for n in cases:
        try:
            ok = list(module.fizzbuzz(n)) == expected(n)
        except Exception as exc:
            ok = False
            print(f"fizzbuzz({n}) raised {exc!r}")
        print(("PASS" if ok else "FAIL") + f": fizzbuzz({n})")
        passed += ok
except Exception as exc:
    print(f"FAIL: could not load /app/fizzbuzz.py: {exc!r}")
fraction = passed / len(cases)
with open("/logs/verifier/reward.json", "w") as f:
    json.dump({"reward": 1.0 if passed == len(cases) else 0.0, "cases_passed": fraction}, f)
PY
