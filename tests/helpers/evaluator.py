"""An evaluator in a process of its own, for tests whose candidate attacks the evaluator itself.

    python tests/helpers/evaluator.py PROBLEM CANDIDATE CONFIG_JSON

prints the result as JSON on its last line of output. A test starts it with the environment it
wants the evaluator to have (a canary secret) and survives when a candidate kills it.
"""

import json
import sys

from kernelwright.core.config import EvalConfig
from kernelwright.engine import evaluate

if __name__ == "__main__":
    problem, candidate, config = sys.argv[1:4]
    result = evaluate(problem, candidate, EvalConfig.from_dict(json.loads(config)))
    print(json.dumps(result.to_dict()))
