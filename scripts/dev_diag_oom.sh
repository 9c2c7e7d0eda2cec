export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
. scripts/install_bwrap_deb.sh >/dev/null 2>&1
P=$PWD/examples/cuda_swish
for b in 0 16000; do
  d=$(mktemp -d); cd $d; [ $b -gt 0 ] && printf '[eval.timing]\nwindow_budget_mb = %s\n' $b > kernelwright.toml
  timeout 100 python3 -m kernelwright.cli.main eval $P/problem.py $P/candidate.py --json --no-server --device cuda > $OUT/r$b.json 2>$OUT/e$b.txt
  python3 -c "
import json,sys; r=json.load(open('$OUT/r$b.json')); m=r.get('metadata') or {}; t=m.get('timing') or {}
print($b, r['status'], r.get('speedup'), t.get('calls_per_window'), t.get('plan'), (r.get('error_log') or '')[:150]); print(str(m.get('engine_traceback'))[-1500:])"
  cd - >/dev/null
done
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
