"""A tokenizer whose tokens are characters ('a' → 97), for episode and tool tests that need no model."""


class CharTokenizer:
    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)
