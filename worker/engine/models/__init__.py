"""Model families on ragged batches: BERT / RoBERTa / XLM-RoBERTa encoders and Qwen3."""
