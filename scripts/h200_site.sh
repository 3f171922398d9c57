# Sourced by the lent-H200 scripts (h200_validate.sh, h200_priority.sh, h200_overload.sh), from the repository root.
# h200_wheels: this project's extra cp312 wheels (.gpu/c, carried in call 2; docs/REAL_VLLM.md) into /tmp/site.
# h200_models: the four model shapes (.gpu/bin/mkmodels.py) when this machine has none yet.
h200_wheels() {
  if ls .gpu/c/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/c/*.whl 2>&1 \
      | grep -v "Target directory" | tail -2
  fi
}
h200_models() { [ -d /tmp/models/qwen2.5-7b ] || python3 .gpu/bin/mkmodels.py /tmp/models > /dev/null; }
