#!/usr/bin/env python3
# Golden fixtures for attn's seq2seq pieces: PyTorch's nn.GRU, one step of the book's Bahdanau
# decoder, and the whole encoder-decoder's masked loss, with autograd gradients, written as small
# safetensors files under tests/fixtures/seq2seq/.
"""Generate the PyTorch fixtures that tests/seq2seq/pytorch_fixtures_test.cpp reads.

What it does
    Re-states, in this file, the PyTorch code of "Dive into Deep Learning" (d2l.ai), chapter
    "The Bahdanau Attention Mechanism": AdditiveAttention (W_k, W_q, w_v without bias, the
    masked softmax with the -1e6 trick), Seq2SeqAttentionDecoder (query = previous top-layer
    hidden state, GRU input = [context, embedding], dense output layer) and the GRU encoder
    (embedding then nn.GRU), plus the masked token-mean cross-entropy of the book's Seq2Seq.loss.
    No d2l package is used. Everything runs in float32, eval mode, dropout 0, one CPU thread,
    under fixed seeds, so a rerun writes the same bytes.

    Files (every tensor float32; token ids and lengths are stored as exact small floats):
        gru.safetensors           nn.GRU(5, 6, num_layers=2): "inputs" (T=4, B=3, 5),
                                  "initial_state" (2, 3, 6), the parameters under
                                  "rnn.<name>", "outputs", "state", the upstream gradients
                                  "grad_outputs" and "grad_state", and autograd's gradients of
                                  (outputs * grad_outputs).sum() + (state * grad_state).sum()
                                  under "grads.inputs", "grads.initial_state", "grads.rnn.<name>".
        decoder_step.safetensors  one decoder step, vocabulary 11, embedding 4, hidden 6, 2
                                  layers, batch 3, 5 keys: "enc_outputs" (5, 3, 6) time-major,
                                  "hidden" (2, 3, 6), "valid_lens" (3), "tokens" (3), the
                                  parameters under "decoder.<name>", "logits" (3, 11), "state",
                                  "attention_weights" (3, 5), "grad_logits" and the gradients of
                                  (logits * grad_logits).sum() under "grads.enc_outputs",
                                  "grads.hidden", "grads.decoder.<name>".
        seq2seq_loss.safetensors  the whole model (source vocabulary 9, target 8, embedding 4,
                                  hidden 5, 2 layers) on a batch of 3: "source" (3, 6),
                                  "source_valid_lens", "target" (3, 5) (ids ending in <eos>=2,
                                  padded with <pad>=0), "target_valid_lens", the parameters
                                  under "encoder.<name>" and "decoder.<name>", "loss" (1) and
                                  its gradients under "grads.<name>".

How to run (from the repository root)
    build/venv/bin/python tools/make_seq2seq_fixtures.py
    Needs torch and safetensors; the test suite does not.
"""

import pathlib

import torch
from safetensors.torch import save_file
from torch import nn

SEED = 20250412
FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "seq2seq"
PAD, BOS, EOS = 0, 1, 2


def masked_softmax(X, valid_lens):
    """Softmax over the last axis of X (B, n, m), keeping only the first valid_lens keys."""
    shape = X.shape
    valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    X = X.reshape(-1, shape[-1])
    mask = torch.arange(shape[-1], dtype=torch.float32)[None, :] < valid_lens[:, None]
    X = X.masked_fill(~mask, -1e6)
    return nn.functional.softmax(X.reshape(shape), dim=-1)


class AdditiveAttention(nn.Module):
    def __init__(self, num_hiddens):
        super().__init__()
        self.W_k = nn.Linear(num_hiddens, num_hiddens, bias=False)
        self.W_q = nn.Linear(num_hiddens, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)

    def forward(self, queries, keys, values, valid_lens):
        queries, keys = self.W_q(queries), self.W_k(keys)
        features = torch.tanh(queries.unsqueeze(2) + keys.unsqueeze(1))
        scores = self.w_v(features).squeeze(-1)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.attention_weights, values)


class Encoder(nn.Module):
    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size, num_hiddens, num_layers)

    def forward(self, X):
        return self.rnn(self.embedding(X.t()))


class Decoder(nn.Module):
    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers):
        super().__init__()
        self.attention = AdditiveAttention(num_hiddens)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size + num_hiddens, num_hiddens, num_layers)
        self.dense = nn.Linear(num_hiddens, vocab_size)

    def forward(self, X, enc_outputs, hidden_state, enc_valid_lens):
        """X (B, steps); enc_outputs (B, m, H) batch-major as the book's init_state makes it."""
        X = self.embedding(X).permute(1, 0, 2)
        outputs, self.attention_weights = [], []
        for x in X:
            query = torch.unsqueeze(hidden_state[-1], dim=1)
            context = self.attention(query, enc_outputs, enc_outputs, enc_valid_lens)
            x = torch.cat((context, torch.unsqueeze(x, dim=1)), dim=-1)
            out, hidden_state = self.rnn(x.permute(1, 0, 2), hidden_state)
            outputs.append(out)
            self.attention_weights.append(self.attention.attention_weights)
        outputs = self.dense(torch.cat(outputs, dim=0))
        return outputs.permute(1, 0, 2), hidden_state


def randomise(module, generator):
    """Draws every parameter from U(-0.5, 0.5), so no test depends on an initialisation."""
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.rand(parameter.shape, generator=generator) - 0.5)


def named_grads(module, prefix):
    return {f"grads.{prefix}{name}": p.grad.detach().clone() for name, p in module.named_parameters()}


def named_params(module, prefix):
    return {f"{prefix}{name}": p.detach().clone() for name, p in module.named_parameters()}


def as_float(values):
    return torch.tensor(values, dtype=torch.float32)


def gru_case(generator):
    rnn = nn.GRU(5, 6, num_layers=2)
    randomise(rnn, generator)
    inputs = torch.randn(4, 3, 5, generator=generator).requires_grad_(True)
    initial_state = torch.randn(2, 3, 6, generator=generator).requires_grad_(True)
    outputs, state = rnn(inputs, initial_state)
    grad_outputs = torch.randn(outputs.shape, generator=generator)
    grad_state = torch.randn(state.shape, generator=generator)
    ((outputs * grad_outputs).sum() + (state * grad_state).sum()).backward()
    tensors = {"inputs": inputs.detach(), "initial_state": initial_state.detach(),
               "outputs": outputs.detach(), "state": state.detach(),
               "grad_outputs": grad_outputs, "grad_state": grad_state,
               "grads.inputs": inputs.grad, "grads.initial_state": initial_state.grad}
    tensors.update(named_params(rnn, "rnn."))
    tensors.update(named_grads(rnn, "rnn."))
    return tensors


def decoder_step_case(generator):
    decoder = Decoder(11, 4, 6, 2)
    randomise(decoder, generator)
    enc_outputs = torch.randn(5, 3, 6, generator=generator).requires_grad_(True)
    hidden = torch.randn(2, 3, 6, generator=generator).requires_grad_(True)
    valid_lens = torch.tensor([5, 2, 3])
    tokens = torch.tensor([[7], [1], [10]])
    logits, state = decoder(tokens, enc_outputs.permute(1, 0, 2), hidden, valid_lens)
    grad_logits = torch.randn(logits.shape, generator=generator)
    (logits * grad_logits).sum().backward()
    tensors = {"enc_outputs": enc_outputs.detach(), "hidden": hidden.detach(),
               "valid_lens": valid_lens.float(), "tokens": tokens.reshape(-1).float(),
               "logits": logits.detach().reshape(3, 11), "state": state.detach(),
               "attention_weights": decoder.attention_weights[0].detach().reshape(3, 5),
               "grad_logits": grad_logits.reshape(3, 11),
               "grads.enc_outputs": enc_outputs.grad, "grads.hidden": hidden.grad}
    tensors.update(named_params(decoder, "decoder."))
    tensors.update(named_grads(decoder, "decoder."))
    return tensors


def seq2seq_loss_case(generator):
    encoder = Encoder(9, 4, 5, 2)
    decoder = Decoder(8, 4, 5, 2)
    randomise(encoder, generator)
    randomise(decoder, generator)
    source = torch.tensor([[5, 3, 8, 2, 0, 0], [4, 4, 6, 7, 3, 2], [8, 2, 0, 0, 0, 0]])
    source_valid_lens = torch.tensor([4, 6, 2])
    target = torch.tensor([[3, 4, 2, 0, 0], [7, 5, 6, 3, 2], [2, 0, 0, 0, 0]])
    target_valid_lens = torch.tensor([3, 5, 1])
    enc_outputs, enc_state = encoder(source)
    decoder_inputs = torch.cat([torch.full((3, 1), BOS), target[:, :-1]], dim=1)
    logits, _ = decoder(decoder_inputs, enc_outputs.permute(1, 0, 2), enc_state, source_valid_lens)
    token_losses = nn.functional.cross_entropy(logits.reshape(-1, 8), target.reshape(-1),
                                               reduction="none")
    mask = (target.reshape(-1) != PAD).float()
    loss = (token_losses * mask).sum() / mask.sum()
    loss.backward()
    tensors = {"source": source.float(), "source_valid_lens": source_valid_lens.float(),
               "target": target.float(), "target_valid_lens": target_valid_lens.float(),
               "loss": loss.detach().reshape(1)}
    tensors.update(named_params(encoder, "encoder."))
    tensors.update(named_params(decoder, "decoder."))
    tensors.update(named_grads(encoder, "encoder."))
    tensors.update(named_grads(decoder, "decoder."))
    return tensors


def main():
    torch.set_num_threads(1)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    cases = {"gru": gru_case, "decoder_step": decoder_step_case,
             "seq2seq_loss": seq2seq_loss_case}
    for index, (name, make) in enumerate(cases.items()):
        generator = torch.Generator().manual_seed(SEED + index)
        tensors = {key: value.detach().contiguous().float() for key, value in make(generator).items()}
        path = FIXTURES / f"{name}.safetensors"
        save_file(tensors, str(path), metadata={"generator": "tools/make_seq2seq_fixtures.py"})
        print(f"{path.relative_to(FIXTURES.parent.parent.parent)}: {len(tensors)} tensors, "
              f"{path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
