"""Slow reference shared by the encoder tests: the runs of trained tokens in a row of labels."""


def trained_runs(labels) -> list[list[int]]:
    """Contiguous runs of trained tokens (label != -100), as lists of ids; a plain loop over tokens."""
    runs, current = [], []
    for token in labels:
        if token == -100:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(token)
    return [*runs, current] if current else runs
