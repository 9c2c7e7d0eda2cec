"""The jobs the parent hands the runner and the judge: typed, checked where they are read."""

from __future__ import annotations

import pytest


def test_a_job_is_read_typed_and_a_malformed_one_is_refused_with_the_field_named():
    from kernelwright.engine.child.protocol import JobError, JudgeJob, RunnerJob

    job = RunnerJob.from_json({"config": {}, "candidate_path": "c.py", "fd": 5, "verified_builds": {"ext": "ab12"}})
    assert job.fd == 5 and job.mode == "evaluate" and job.verified_builds == {"ext": "ab12"}
    assert RunnerJob.from_json(job.to_json()) == job
    refused = [
        ({"config": {}, "fd": "5"}, "RunnerJob.fd must be int or null"),
        ({"config": {}, "fd": True}, "RunnerJob.fd must be int or null"),
        ({"config": {}, "candidate": "c.py"}, "unknown fields: candidate"),
        ({"config": {}, "mode": "run_anything"}, "RunnerJob.mode must be one of"),
        ({"candidate_path": "c.py"}, "config"),
        ([], "must be a JSON object"),
    ]
    for raw, message in refused:
        with pytest.raises(JobError, match=message):
            RunnerJob.from_json(raw)
    assert JudgeJob.from_json({"config": {"device": "cpu"}}).problem_name == "problem.py"
    with pytest.raises(JobError, match="JudgeJob.candidate_jit must be bool"):
        JudgeJob.from_json({"config": {}, "candidate_jit": "yes"})
