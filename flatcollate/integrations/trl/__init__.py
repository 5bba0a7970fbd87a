"""TRL trainers, padding-free: `FlatSFTTrainer` (`sft`), and for the training after SFT `FlatDPOTrainer` (`dpo`),
`FlatKTOTrainer` (`kto`), `FlatRewardTrainer` (`reward`) and `FlatGRPOTrainer` (`grpo`). Each is the TRL trainer it
subclasses, collating with flatcollate and preparing the model so that nothing attends across sequences;
`flat_forward` lays the preference trainers' flattened forwards out as TRL's padded ones.

Imports from flatcollate: `_conventions`, `collate`, `modeling`, `vision`, `preference`.
"""

from .dpo import FlatDPOTrainer
from .grpo import FlatGRPOTrainer
from .kto import FlatKTOTrainer
from .reward import FlatRewardTrainer
from .sft import FlatSFTTrainer

__all__ = ["FlatDPOTrainer", "FlatGRPOTrainer", "FlatKTOTrainer", "FlatRewardTrainer", "FlatSFTTrainer"]
