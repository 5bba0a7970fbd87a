"""The benchmark tasks, one module each, each defining `TASK` (`flatcollate.bench.harness.Task`): `sft` (text SFT,
`flatcollate bench`), `vision` (image-text SFT, `--vision`), `dpo` and `reward` (TRL's preference trainers against
flatcollate's, `--task dpo|reward`) and `grpo` (GRPO's log-prob pass, `--task grpo`). A new task is a new module
here: the harness finds it by its name."""
