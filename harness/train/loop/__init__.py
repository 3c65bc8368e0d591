"""The loop: the step (`trainer`), the evaluation (`evaluator`), the epochs and their actions (`controller`), built
in one place (`factory.build_run`)."""
