# Shared by scripts/lint and scripts/test (after .venv is set up): ruff (rules and format, from
# pyproject.toml [tool.ruff]) and mypy --strict on the package ([tool.mypy]). All three always
# run; LINT_STATUS is non-zero if any finds anything.
LINT_STATUS=0
.venv/bin/ruff check vrambudget tests bench research scripts || LINT_STATUS=1
.venv/bin/ruff format --check vrambudget tests bench research scripts || LINT_STATUS=1
.venv/bin/mypy || LINT_STATUS=1
