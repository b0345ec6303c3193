"""Tokenizer, chat templates and sampling."""
