"""Chat / supervised fine-tuning data: conversations rendered with the tokenizer's chat template.

``template`` renders a Hugging Face chat template (Jinja) and finds the trained text,
``render`` is the operator that turns conversation records into token ids with a
trained-token mask, ``assembly`` builds a chat recipe's operator chain. The recipe's
``[chat]`` table is :mod:`zephon_nodes.recipe.chat`. See ``docs/sft.md``.
"""
