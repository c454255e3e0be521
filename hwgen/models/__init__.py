"""Float models shared by several domains (standard library, numpy and, when a model is built,
torch): :mod:`hwgen.models.minilm` is the all-MiniLM-L6-v2 sentence encoder that WindVE serves,
ESPN encodes with and the I-BERT MiniLM is quantised from."""
