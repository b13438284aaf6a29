"""The special token ids, declared once.

T5's SentencePiece vocabularies (and every vocabulary this project trains)
reserve the first ids: pad 0, EOS 1, UNK 2. T5's decoder starts from the pad
id, so the decoder start token is 0 too. Models, data, training and the
engine all take these from here.
"""

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
DECODER_START_ID = PAD_ID
