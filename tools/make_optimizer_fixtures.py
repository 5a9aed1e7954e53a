"""Writes tests/fixtures/optimizers/updates.safetensors: PyTorch's SGD and Adam trajectories.

Three steps of torch.optim.SGD(lr=0.1, momentum=0.9, weight_decay=0.01) and of
torch.optim.Adam(lr=0.01, weight_decay=0.1) (other arguments at their defaults) from the same
initial parameter with the same three gradients, and torch.nn.utils.clip_grad_norm_ on two
gradients. attn's tests compare their own optimizers against these numbers.

Run: build/venv/bin/python tools/make_optimizer_fixtures.py  (PyTorch from PyPI; the tests
only read the committed file). Deterministic: same bytes on every run.
"""

import pathlib

import torch
from safetensors.torch import save_file

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "optimizers"


def trajectory(make_optimizer, initial, grads):
    parameter = torch.nn.Parameter(initial.clone())
    optimizer = make_optimizer([parameter])
    states = []
    for grad in grads:
        parameter.grad = grad.clone()
        optimizer.step()
        states.append(parameter.detach().clone())
    return torch.stack(states)


def main():
    generator = torch.Generator().manual_seed(7)
    initial = torch.randn(5, generator=generator)
    grads = torch.randn(3, 5, generator=generator)
    sgd = trajectory(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01), initial, grads)
    adam = trajectory(lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1), initial, grads)

    first = torch.nn.Parameter(torch.zeros(3))
    second = torch.nn.Parameter(torch.zeros(2, 2))
    first.grad = torch.tensor([3.0, 0.0, 4.0])
    second.grad = torch.tensor([[12.0, 0.0], [0.0, 0.0]])
    norm = torch.nn.utils.clip_grad_norm_([first, second], max_norm=6.5)

    OUT.mkdir(parents=True, exist_ok=True)
    save_file(
        {
            "initial": initial,
            "grads": grads,
            "sgd": sgd,
            "adam": adam,
            "clip_norm": norm.reshape(1),
            "clipped_first": first.grad,
            "clipped_second": second.grad,
        },
        str(OUT / "updates.safetensors"),
        metadata={"torch": torch.__version__},
    )


if __name__ == "__main__":
    main()
