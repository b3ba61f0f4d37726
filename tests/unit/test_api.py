from kanal.protocol.api import ApiKey, api_name, preload, supported_versions


def test_preload_loads_the_version_clients_will_pick() -> None:
    assert preload({ApiKey.FETCH: (0, 17), ApiKey.PRODUCE: (0, 11)}, (ApiKey.FETCH, ApiKey.PRODUCE)) == 4
    assert preload({ApiKey.FETCH: (0, 2)}, (ApiKey.FETCH,)) == 0  # no version in common
    assert preload({}, (ApiKey.METADATA,)) == 0  # the upstream does not offer it


def test_names_and_versions() -> None:
    assert api_name(0) == "Produce" and api_name(60) == "DescribeCluster" and api_name(9999) == "Unknown(9999)"
    assert supported_versions(1) == (4, 18) and supported_versions(9999) is None
