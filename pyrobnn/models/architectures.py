"""Ready network architectures (ordinary deterministic ``nn.Module``\\ s to make Bayesian)."""

from __future__ import annotations

from torch import nn

__all__ = ["MLP", "LeNet300100", "LeNet5"]

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "gelu": nn.GELU, "elu": nn.ELU}


class MLP(nn.Sequential):
    """Fully connected network ``in -> hidden... -> out``.

    The UCI regression protocol of Hernández-Lobato & Adams 2015 and Gal & Ghahramani 2016
    uses one hidden layer of 50 units (100 for protein): ``MLP(d, 1, hidden=(50,))``.

    :param activation: ``"relu"`` (default), ``"tanh"``, ``"sigmoid"``, ``"gelu"``, ``"elu"``
        or an ``nn.Module`` class (anything that builds the module when called: ``nn.SiLU``,
        ``functools.partial(nn.LeakyReLU, 0.1)``).
    """

    def __init__(self, in_features: int, out_features: int, hidden=(50,), activation="relu"):
        if isinstance(activation, str):
            if activation not in _ACTIVATIONS:
                raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)} or an nn.Module class, got {activation!r}")
            act = _ACTIVATIONS[activation]
        elif callable(activation):
            act = activation
        else:
            raise TypeError(f"activation must be one of {sorted(_ACTIVATIONS)} or an nn.Module class, got {activation!r}")
        layers = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), act()]
            width = h
        layers.append(nn.Linear(width, out_features))
        super().__init__(*layers)


class LeNet300100(nn.Sequential):
    """LeNet-300-100 (LeCun et al. 1998): 784-300-100-10 with ReLU; flattens its input, so
    ``(N, 1, 28, 28)`` images and ``(N, 784)`` vectors both work. 266,610 parameters."""

    def __init__(self, in_features: int = 784, num_classes: int = 10):
        super().__init__(
            nn.Flatten(),
            nn.Linear(in_features, 300),
            nn.ReLU(),
            nn.Linear(300, 100),
            nn.ReLU(),
            nn.Linear(100, num_classes),
        )


class LeNet5(nn.Module):
    """LeNet-5 as in Caffe's example and in Molchanov et al. 2017: conv 20@5x5, max-pool,
    conv 50@5x5, max-pool, fully connected 800-500-10, ReLU. Takes ``(N, 1, 28, 28)``.
    431,080 parameters."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 20, 5)
        self.conv2 = nn.Conv2d(20, 50, 5)
        self.fc1 = nn.Linear(800, 500)
        self.fc2 = nn.Linear(500, num_classes)
        self.pool = nn.MaxPool2d(2)
        self.act = nn.ReLU()

    def forward(self, x):
        x = self.pool(self.act(self.conv1(x)))
        x = self.pool(self.act(self.conv2(x)))
        x = self.act(self.fc1(x.flatten(1)))
        return self.fc2(x)
