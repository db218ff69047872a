"""The GPU campaign (``campaign.sh``, ``campaign.py``) and its wheels (``prepare.sh``)."""
