"""Airflow operators: thin adapters over cluster/, backends/, data/ and serving/."""
