"""Loading a `StatefulDataLoader` state into a loader with another worker count: a clear error before torchdata's."""

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from flatcollate import DataCollatorWithFlattening
from flatcollate.streaming import StreamingPacker, load_loader_state
from flatcollate.streaming.loader_state import saved_num_workers

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

ROWS = [{"input_ids": [i] * (1 + i % 7)} for i in range(60)]


def make_loader(num_workers):
    packer = StreamingPacker(ROWS, pack_len=16, buffer_size=4)
    return StatefulDataLoader(packer, batch_size=2, num_workers=num_workers, collate_fn=DataCollatorWithFlattening())


def state_after(num_workers, steps=3):
    loader = make_loader(num_workers)
    iterator = iter(loader)
    for _ in range(steps):
        next(iterator)
    state = loader.state_dict()
    del iterator
    return state


def batches(loader):
    return [batch["input_ids"].tolist() for batch in loader]


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_saved_num_workers_reads_the_layout(num_workers):
    assert saved_num_workers(state_after(num_workers)) == num_workers


@pytest.mark.parametrize(("saved", "resumed"), [(2, 0), (0, 2), (2, 1)])
def test_other_worker_count_is_refused_naming_both_and_the_fix(saved, resumed):
    state = state_after(saved)
    loader = make_loader(resumed)
    message = rf"saved with num_workers={saved} but this StatefulDataLoader has num_workers={resumed}\..*"
    message += rf"with num_workers={saved} to resume"
    with pytest.raises(ValueError, match=message):
        load_loader_state(loader, state)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_same_worker_count_resumes_exactly(num_workers):
    full = batches(make_loader(num_workers))
    loader = make_loader(num_workers)
    head = [batch["input_ids"].tolist() for _, batch in zip(range(3), loader, strict=False)]
    state = loader.state_dict()
    resumed = make_loader(num_workers)
    load_loader_state(resumed, state)
    assert head + batches(resumed) == full


@pytest.mark.parametrize("state", [{"_snapshot": {}}, {"dataset_state": None}, [1, 2]])
def test_state_that_is_not_a_loader_state_is_refused(state):
    with pytest.raises((TypeError, ValueError), match=r"StatefulDataLoader\.state_dict"):
        load_loader_state(make_loader(0), state)


def test_plain_dataloader_is_refused():
    from torch.utils.data import DataLoader

    with pytest.raises(TypeError, match="StatefulDataLoader"):
        load_loader_state(DataLoader(ROWS), state_after(0))
