"""Reports of runs and suites: the data (`data.py`), plots drawn as inline SVG (`plots.py`), and
one self-contained HTML page (`html.py`, template `templates/report.html.j2`)."""
