"""The command line (`main.py`) and its console output (`console.py`)."""
