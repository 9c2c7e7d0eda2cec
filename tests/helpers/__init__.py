"""Modules the tests share that are not tests: a fake chat server (`chat_server`), an evaluator in a
process of its own (`evaluator`), scripted suite models (`suite_models`) and the Mamba-2 problem at
other shapes (`mamba2_shapes`). Tests import them as `helpers.<module>` (pytest puts `tests/` on the
path, as it does for `conftest`)."""
