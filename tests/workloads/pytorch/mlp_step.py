"""The small MLP training step the PyTorch benchmarks time, written once so that they time the
same step."""


def mlp_step(torch):
    """A step (forward, backward, AdamW update) of a 3-layer MLP on the current CUDA device."""
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
        torch.nn.ReLU(), torch.nn.Linear(256, 10)).to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        x = torch.randn(32, 64, device="cuda")
        y = torch.randint(0, 10, (32,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step
