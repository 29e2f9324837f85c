"""Building blocks shared by the model families: attention, rotary tables, fused elementwise ops."""
