"""Slow, obviously correct reference: flatten a batch with one plain Python loop per sequence and token."""
import itertools

IGNORE = -100


def reference_flatten(features, *, separator_id=IGNORE, position_ids_start=0, pad_to_multiple_of=None, pad_token_id=0):
    input_ids, labels, position_ids, seq_idx, cu = [], [], [], [], [0]
    seq = 0
    for feature in features:
        ids = [int(x) for x in feature["input_ids"]]
        labs = [int(x) for x in feature["labels"]] if feature.get("labels") is not None else list(ids)
        for key in ("completion_mask", "assistant_masks"):
            if feature.get(key) is not None:
                labs = [lab if int(m) else IGNORE for lab, m in zip(labs, feature[key], strict=True)]
        lengths = [int(x) for x in feature.get("seq_lengths", [len(ids)])]
        start = 0
        for length in lengths:
            for offset in range(length):
                input_ids.append(ids[start + offset])
                labels.append(separator_id if offset == 0 else labs[start + offset])
                position_ids.append(position_ids_start + offset)
                seq_idx.append(seq)
            cu.append(cu[-1] + length)
            seq += 1
            start += length
    if pad_to_multiple_of and len(input_ids) % pad_to_multiple_of:
        pad = pad_to_multiple_of - len(input_ids) % pad_to_multiple_of
        for offset in range(pad):
            input_ids.append(pad_token_id)
            labels.append(IGNORE)
            position_ids.append(position_ids_start + offset)
            seq_idx.append(seq)
        cu.append(cu[-1] + pad)
    lengths = [b - a for a, b in itertools.pairwise(cu)]
    return {
        "input_ids": [input_ids],
        "labels": [labels],
        "position_ids": [position_ids],
        "seq_idx": [seq_idx],
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": max(lengths),
        "max_length_k": max(lengths),
    }
