"""Image-text processors built from local files, with or without torchvision.

transformers builds a processor that has a video slot (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V, LLaVA-OneVision, ...)
only together with its video processor, and every video processor needs torchvision. Without torchvision,
`AutoProcessor.from_pretrained(local_dir)` raises `ImportError` (`Qwen2VLVideoProcessor requires the Torchvision
library`) and the class's own constructor raises inside transformers, `video_processor=None` included
(`type object 'VIDEO_PROCESSOR_MAPPING' has no attribute '_extra_content'`); with torchvision the constructor still
wants a video processor. Image-text fine-tuning needs the images only:

- `images_only(processor_class)`: the family's processor class without its video slot, built from an image processor
  and a tokenizer;
- `load_processor(local_dir)`: `AutoProcessor.from_pretrained(local_dir)` where transformers has torchvision and the
  directory holds a video processor's settings, else the family's processor without its video slot, read from the
  same files.

`pip install "flatcollate[vision]"` installs torchvision (the build made for the installed torch).
"""

import functools
import inspect
import json
from pathlib import Path

from transformers import AutoProcessor, ProcessorMixin
from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
from transformers.utils import is_torchvision_available

HAS_TORCHVISION: bool = is_torchvision_available()
"""Whether transformers can build video processors (and so `AutoProcessor` every image-text processor); transformers'
own check, read once."""

VIDEO_SLOT = "video_processor"
VIDEO_FILES = ("video_preprocessor_config.json", "preprocessor_config.json")
"""Files `AutoVideoProcessor` reads a video processor's settings from, after `processor_config.json`'s
`"video_processor"` entry (a model snapshot's `preprocessor_config.json` serves both image and video processors)."""
CLASS_FILES = ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json")
"""Files whose `processor_class` names a directory's processor, in the order `AutoProcessor` reads them; else the
`model_type` of `config.json` does."""


def _new_instance(processor_class: type) -> ProcessorMixin:
    """An empty instance of `images_only(processor_class)`, filled by unpickling."""
    cls = images_only(processor_class)
    return cls.__new__(cls)


@functools.cache
def images_only(processor_class: type) -> type:
    """`processor_class` without its video slot: built from `image_processor` and `tokenizer` (and the class's other
    options), it encodes text and images as `processor_class` does, and needs no torchvision.

    The class returned is a subclass of `processor_class` with the same name (`isinstance` holds, a saved processor
    names `processor_class`), the same class on every call; it pickles, so encoders built on it run in `datasets.map`
    workers. Videos are refused. A class without a video slot is returned as it is.

    Args:
        processor_class (`type`): a transformers processor class with an image processor, e.g.
            `Qwen2_5_VLProcessor`.

    Returns:
        `type`: the processor class to build, e.g.
        `images_only(Qwen2_5_VLProcessor)(image_processor=Qwen2VLImageProcessorPil(), tokenizer=tokenizer)`.

    Raises:
        TypeError: `processor_class` is not a transformers processor class.
        ValueError: the class has no image processor.
        ImportError: transformers has the class only with torchvision (Pixtral's, for Mistral 3).

    Example:

    >>> from transformers import LlavaProcessor, Qwen2_5_VLProcessor
    >>> from flatcollate.vision import images_only
    >>> cls = images_only(Qwen2_5_VLProcessor)
    >>> cls.__name__, issubclass(cls, Qwen2_5_VLProcessor), cls.get_attributes()
    ('Qwen2_5_VLProcessor', True, ['image_processor', 'tokenizer'])
    >>> images_only(LlavaProcessor) is LlavaProcessor  # no video slot
    True
    """
    if getattr(processor_class, "is_dummy", False):  # transformers' stand-in for a class whose backend is missing
        raise ImportError(
            f"transformers has {processor_class.__name__} only with {', '.join(processor_class._backends)} installed, "
            "video slot or not: pip install 'flatcollate[vision]' (torchvision built for the installed torch)."
        )
    if not (isinstance(processor_class, type) and issubclass(processor_class, ProcessorMixin)):
        raise TypeError(
            f"images_only takes a transformers processor class such as Qwen2_5_VLProcessor, got {processor_class!r}."
        )
    attributes = processor_class.get_attributes()
    if "image_processor" not in attributes:
        raise ValueError(
            f"{processor_class.__name__} has no image processor (its parts: {', '.join(attributes)}): images_only "
            "builds image-text processors."
        )
    if VIDEO_SLOT not in attributes:
        return processor_class
    kept = [name for name in attributes if name != VIDEO_SLOT]
    call = inspect.signature(processor_class.__call__)

    def get_attributes(cls) -> list[str]:
        return list(kept)

    def __call__(self, *args, **kwargs):
        if call.bind_partial(self, *args, **kwargs).arguments.get("videos") is not None:
            raise ValueError(
                f"This {processor_class.__name__} was built without its video processor (flatcollate.vision."
                "images_only; transformers' video processors need torchvision): pass images only, or install "
                "torchvision (pip install 'flatcollate[vision]') and build it with AutoProcessor.from_pretrained."
            )
        return super(cls, self).__call__(*args, **kwargs)

    def __reduce__(self):  # rebuilt through `images_only`: the class is made here, not importable by its name
        return _new_instance, (processor_class,), self.__dict__

    cls = type(
        processor_class.__name__,
        (processor_class,),
        {
            "__doc__": f"{processor_class.__name__} without its video slot (`flatcollate.vision.images_only`).",
            "__module__": __name__,
            "get_attributes": classmethod(get_attributes),
            "__call__": __call__,
            "__reduce__": __reduce__,
        },
    )
    return cls


def processor_class_of(directory: str | Path) -> type:
    """The processor class a local directory names: `processor_class` in its processor, image processor or tokenizer
    config, else the processor transformers maps its `config.json` model type to.

    Raises:
        ValueError: no file names a processor class transformers has.
    """
    directory = Path(directory)
    for name in CLASS_FILES:
        path = directory / name
        if path.is_file() and (class_name := json.loads(path.read_text()).get("processor_class")):
            return _transformers_class(class_name, path)
    config = directory / "config.json"
    model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    if model_type in PROCESSOR_MAPPING_NAMES:
        return _transformers_class(PROCESSOR_MAPPING_NAMES[model_type], config)
    raise ValueError(
        f"No processor class named in {directory}: none of {', '.join(CLASS_FILES)} has a `processor_class`, and "
        f"config.json's model_type ({model_type!r}) has no processor in transformers. Save the processor there "
        "(processor.save_pretrained) or pass its parts to images_only(ProcessorClass)(image_processor=..., "
        "tokenizer=...)."
    )


def holds_video_processor(directory: str | Path) -> bool:
    """Whether `AutoProcessor` finds a video processor's settings in a local directory: not in one saved by an
    `images_only` processor (its `processor_config.json` has no `"video_processor"`, and no other file serves)."""
    directory = Path(directory)
    nested = directory / "processor_config.json"
    if nested.is_file() and VIDEO_SLOT in json.loads(nested.read_text()):
        return True
    return any((directory / name).is_file() for name in VIDEO_FILES)


def _transformers_class(class_name: str, source: Path) -> type:
    import transformers

    processor_class = getattr(transformers, class_name, None)
    if processor_class is None:
        raise ValueError(
            f"{source} names the processor class {class_name!r}, which transformers {transformers.__version__} does "
            "not have (a class of the repository's own code is built by AutoProcessor.from_pretrained(..., "
            "trust_remote_code=True))."
        )
    return processor_class


def load_processor(directory: str | Path, **kwargs) -> ProcessorMixin:
    """The image-text processor saved in a local directory (a model snapshot or `save_pretrained`'s output).

    Where transformers has torchvision: `AutoProcessor.from_pretrained(directory, **kwargs)`, video processor
    included. Without it, or for a directory an `images_only` processor was saved to (it holds no video processor):
    `images_only` of the class the directory names, read from the same files (image processor, tokenizer, chat
    template), which encodes text and images as the full processor does and refuses videos. Without torchvision its
    image processor is the PIL backend transformers falls back to: the same ids and image grids, pixel values that
    differ from the torchvision backend's by resampling rounding.

    Args:
        directory (`str` or `Path`): a local directory; nothing is downloaded.
        kwargs: passed to `from_pretrained` (e.g. `min_pixels=`, `max_pixels=` for Qwen2-VL's image processor).

    Raises:
        ValueError: `directory` is not a directory, or names no processor class transformers has.
    """
    path = Path(directory)
    if not path.is_dir():
        raise ValueError(
            f"load_processor reads a local directory; {str(directory)!r} is not one. Download a model's files first "
            "(huggingface_hub.snapshot_download(repo_id) or `hf download REPO_ID --local-dir DIR`)."
        )
    if HAS_TORCHVISION and holds_video_processor(path):
        return AutoProcessor.from_pretrained(path, **kwargs)
    return images_only(processor_class_of(path)).from_pretrained(path, **kwargs)
