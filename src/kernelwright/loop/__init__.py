"""The forge loop: Coder, engine and Judge round by round (`forge.py`), the records a run is made
of (`history.py`), and the engine's evidence as text for the LLM Judge (`llm_judge_evidence.py`)."""
