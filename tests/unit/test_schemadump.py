"""sql/schema.sql's normalisation of pg_dump output: only what varies between runs goes."""

import pytest

from gateway.testing.schemadump import HEADER, normalise

BANNER = """--
-- PostgreSQL database dump
--

\\restrict aG7cGdYrjfXuOegw5n11PNTRZN6zDj1NFiwbTH3qf4njV4N8sekZN5AWpE2PHNO

-- Dumped from database version 18.6
-- Dumped by pg_dump version 18.6

SET statement_timeout = 0;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;

"""
TAIL = """

--
-- PostgreSQL database dump complete
--

\\unrestrict uWelecXJG9yfwSYrOcb15KQKclsGBTPJITrCo659NnD0A2yd8gUfuegXfvZvUPC

"""
FUNCTION = """--
-- Name: f(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.f() RETURNS integer
    LANGUAGE sql
    AS $$
SET LOCAL x = 1;

SELECT 1
$$;"""
KEPT_FUNCTION = FUNCTION.replace("Name: f(); Type: FUNCTION; Schema: public; Owner: -", "FUNCTION: f()")
TABLE = """--
-- Name: t; Type: TABLE; Schema: public; Owner: -
--

SET default_tablespace = '';

SET default_table_access_method = heap;

CREATE TABLE public.t (
    id bigint
);"""
KEPT_TABLE = """--
-- TABLE: t
--

CREATE TABLE public.t (
    id bigint
);"""


@pytest.mark.parametrize(
    ("dump", "expected"),
    [
        # The banner, the restore's settings and the per-run \restrict key go; bodies stay as written.
        (BANNER + FUNCTION + TAIL, KEPT_FUNCTION),
        # The table defaults pg_dump sets before the first table go with their blank lines.
        (BANNER + TABLE + TAIL, KEPT_TABLE),
        (BANNER + FUNCTION + "\n\n\n" + TABLE + TAIL, KEPT_FUNCTION + "\n\n\n" + KEPT_TABLE),
    ],
)
def test_normalise_keeps_the_schema_and_drops_the_chrome(dump: str, expected: str) -> None:
    assert normalise(dump) == HEADER + "\n" + expected + "\n"


def test_two_runs_differing_only_in_their_restrict_key_normalise_alike() -> None:
    other = (BANNER + TABLE + TAIL).replace("aG7cGdYr", "zzzzzzzz").replace("uWelecXJ", "yyyyyyyy")
    assert normalise(other) == normalise(BANNER + TABLE + TAIL)
