"""TRL trainers, padding-free: `FlatSFTTrainer` (`sft`), and for the training after SFT `FlatDPOTrainer` (`dpo`) and
`FlatRewardTrainer` (`reward`). Each is the TRL trainer it subclasses, collating with flatcollate and preparing the
model so that nothing attends across sequences.

Imports from flatcollate: `_conventions`, `collate`, `modeling`, `vision`, `preference`.
"""

from .dpo import FlatDPOTrainer
from .grpo import FlatGRPOTrainer
from .reward import FlatRewardTrainer
from .sft import FlatSFTTrainer

__all__ = ["FlatDPOTrainer", "FlatGRPOTrainer", "FlatRewardTrainer", "FlatSFTTrainer"]
