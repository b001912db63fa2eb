"""The WOMD ``Scenario`` protobuf schema, declared in Python (no generated code, no TF).

Field numbers and enum values follow the public Waymo Open Dataset protos
``src/waymo_open_dataset/protos/scenario.proto`` and ``map.proto``
(github.com/waymo-research/waymo-open-dataset, Apache-2.0), proto2 syntax. Only the parts
the simulator reads are declared; other fields (lidar, camera tokens) are kept by the
runtime as unknown fields and ignored.

The messages live in a private descriptor pool, so this never clashes with an installed
``waymo_open_dataset`` package. Use ``Scenario`` (and friends) like generated classes::

    from jaxdrive.data import womd_schema as pb
    s = pb.Scenario(); s.ParseFromString(data)
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "waymo.open_dataset"
_F = descriptor_pb2.FieldDescriptorProto

_OPT = _F.LABEL_OPTIONAL
_REP = _F.LABEL_REPEATED

_SCALARS = {
    "double": _F.TYPE_DOUBLE, "float": _F.TYPE_FLOAT, "int32": _F.TYPE_INT32,
    "int64": _F.TYPE_INT64, "bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING,
}


def _message(file, name, fields, enums=(), oneofs=()):
    """Add message ``name`` with ``fields`` = [(name, number, label, type[, packed, oneof])].

    ``type`` is a scalar name, ``"enum:Full.Name"`` or ``"msg:Full.Name"`` (relative to the
    package).
    """
    msg = file.message_type.add(name=name)
    for enum_name, values in enums:
        enum = msg.enum_type.add(name=enum_name)
        for value_name, number in values:
            enum.value.add(name=value_name, number=number)
    for oneof in oneofs:
        msg.oneof_decl.add(name=oneof)
    for spec in fields:
        fname, number, label, ftype = spec[:4]
        packed = spec[4] if len(spec) > 4 else False
        oneof_index = spec[5] if len(spec) > 5 else None
        field = msg.field.add(name=fname, number=number, label=label)
        if ftype.startswith("enum:"):
            field.type = _F.TYPE_ENUM
            field.type_name = f".{_PACKAGE}.{ftype[5:]}"
        elif ftype.startswith("msg:"):
            field.type = _F.TYPE_MESSAGE
            field.type_name = f".{_PACKAGE}.{ftype[4:]}"
        else:
            field.type = _SCALARS[ftype]
        if packed:
            field.options.packed = True
        if oneof_index is not None:
            field.oneof_index = oneof_index
    return msg


def _map_file() -> descriptor_pb2.FileDescriptorProto:
    """map.proto: map features, polylines and traffic-signal lane states."""
    f = descriptor_pb2.FileDescriptorProto(
        name="jaxdrive/womd/map.proto", package=_PACKAGE, syntax="proto2")
    _message(f, "MapPoint", [("x", 1, _OPT, "double"), ("y", 2, _OPT, "double"),
                             ("z", 3, _OPT, "double")])
    _message(
        f, "TrafficSignalLaneState",
        [("lane", 1, _OPT, "int64"), ("state", 2, _OPT, "enum:TrafficSignalLaneState.State"),
         ("stop_point", 3, _OPT, "msg:MapPoint")],
        enums=[("State", [
            ("LANE_STATE_UNKNOWN", 0), ("LANE_STATE_ARROW_STOP", 1),
            ("LANE_STATE_ARROW_CAUTION", 2), ("LANE_STATE_ARROW_GO", 3),
            ("LANE_STATE_STOP", 4), ("LANE_STATE_CAUTION", 5), ("LANE_STATE_GO", 6),
            ("LANE_STATE_FLASHING_STOP", 7), ("LANE_STATE_FLASHING_CAUTION", 8)])],
    )
    road_line_types = [
        ("TYPE_UNKNOWN", 0), ("TYPE_BROKEN_SINGLE_WHITE", 1), ("TYPE_SOLID_SINGLE_WHITE", 2),
        ("TYPE_SOLID_DOUBLE_WHITE", 3), ("TYPE_BROKEN_SINGLE_YELLOW", 4),
        ("TYPE_BROKEN_DOUBLE_YELLOW", 5), ("TYPE_SOLID_SINGLE_YELLOW", 6),
        ("TYPE_SOLID_DOUBLE_YELLOW", 7), ("TYPE_PASSING_DOUBLE_YELLOW", 8)]
    _message(f, "RoadLine", [("type", 1, _OPT, "enum:RoadLine.RoadLineType"),
                             ("polyline", 2, _REP, "msg:MapPoint")],
             enums=[("RoadLineType", road_line_types)])
    _message(f, "BoundarySegment", [
        ("lane_start_index", 1, _OPT, "int32"), ("lane_end_index", 2, _OPT, "int32"),
        ("boundary_feature_id", 3, _OPT, "int64"),
        ("boundary_type", 4, _OPT, "enum:RoadLine.RoadLineType")])
    _message(f, "LaneNeighbor", [
        ("feature_id", 1, _OPT, "int64"), ("self_start_index", 2, _OPT, "int32"),
        ("self_end_index", 3, _OPT, "int32"), ("neighbor_start_index", 4, _OPT, "int32"),
        ("neighbor_end_index", 5, _OPT, "int32"),
        ("boundaries", 6, _REP, "msg:BoundarySegment")])
    _message(
        f, "LaneCenter",
        [("speed_limit_mph", 1, _OPT, "double"), ("type", 2, _OPT, "enum:LaneCenter.LaneType"),
         ("interpolating", 3, _OPT, "bool"), ("polyline", 8, _REP, "msg:MapPoint"),
         ("entry_lanes", 9, _REP, "int64", True), ("exit_lanes", 10, _REP, "int64", True),
         ("left_neighbors", 11, _REP, "msg:LaneNeighbor"),
         ("right_neighbors", 12, _REP, "msg:LaneNeighbor"),
         ("left_boundaries", 13, _REP, "msg:BoundarySegment"),
         ("right_boundaries", 14, _REP, "msg:BoundarySegment")],
        enums=[("LaneType", [("TYPE_UNDEFINED", 0), ("TYPE_FREEWAY", 1),
                             ("TYPE_SURFACE_STREET", 2), ("TYPE_BIKE_LANE", 3)])],
    )
    _message(f, "RoadEdge", [("type", 1, _OPT, "enum:RoadEdge.RoadEdgeType"),
                             ("polyline", 2, _REP, "msg:MapPoint")],
             enums=[("RoadEdgeType", [("TYPE_UNKNOWN", 0), ("TYPE_ROAD_EDGE_BOUNDARY", 1),
                                      ("TYPE_ROAD_EDGE_MEDIAN", 2)])])
    _message(f, "StopSign", [("lane", 1, _REP, "int64"), ("position", 2, _OPT, "msg:MapPoint")])
    for polygon_msg in ("Crosswalk", "SpeedBump", "Driveway"):
        _message(f, polygon_msg, [("polygon", 1, _REP, "msg:MapPoint")])
    _message(
        f, "MapFeature",
        [("id", 1, _OPT, "int64"),
         ("lane", 3, _OPT, "msg:LaneCenter", False, 0),
         ("road_line", 4, _OPT, "msg:RoadLine", False, 0),
         ("road_edge", 5, _OPT, "msg:RoadEdge", False, 0),
         ("stop_sign", 7, _OPT, "msg:StopSign", False, 0),
         ("crosswalk", 8, _OPT, "msg:Crosswalk", False, 0),
         ("speed_bump", 9, _OPT, "msg:SpeedBump", False, 0),
         ("driveway", 10, _OPT, "msg:Driveway", False, 0)],
        oneofs=["feature_data"],
    )
    return f


def _scenario_file() -> descriptor_pb2.FileDescriptorProto:
    """scenario.proto: tracks, dynamic map states, the Scenario itself."""
    f = descriptor_pb2.FileDescriptorProto(
        name="jaxdrive/womd/scenario.proto", package=_PACKAGE, syntax="proto2",
        dependency=["jaxdrive/womd/map.proto"])
    _message(f, "ObjectState", [
        ("center_x", 2, _OPT, "double"), ("center_y", 3, _OPT, "double"),
        ("center_z", 4, _OPT, "double"), ("length", 5, _OPT, "float"),
        ("width", 6, _OPT, "float"), ("height", 7, _OPT, "float"),
        ("heading", 8, _OPT, "float"), ("velocity_x", 9, _OPT, "float"),
        ("velocity_y", 10, _OPT, "float"), ("valid", 11, _OPT, "bool")])
    _message(
        f, "Track",
        [("id", 1, _OPT, "int32"), ("object_type", 2, _OPT, "enum:Track.ObjectType"),
         ("states", 3, _REP, "msg:ObjectState")],
        enums=[("ObjectType", [("TYPE_UNSET", 0), ("TYPE_VEHICLE", 1), ("TYPE_PEDESTRIAN", 2),
                               ("TYPE_CYCLIST", 3), ("TYPE_OTHER", 4)])],
    )
    _message(f, "DynamicMapState", [("lane_states", 1, _REP, "msg:TrafficSignalLaneState")])
    _message(
        f, "RequiredPrediction",
        [("track_index", 1, _OPT, "int32"),
         ("difficulty", 2, _OPT, "enum:RequiredPrediction.DifficultyLevel")],
        enums=[("DifficultyLevel", [("NONE", 0), ("LEVEL_1", 1), ("LEVEL_2", 2)])],
    )
    _message(f, "Scenario", [
        ("timestamps_seconds", 1, _REP, "double"),
        ("tracks", 2, _REP, "msg:Track"),
        ("objects_of_interest", 4, _REP, "int32"),
        ("scenario_id", 5, _OPT, "string"),
        ("sdc_track_index", 6, _OPT, "int32"),
        ("dynamic_map_states", 7, _REP, "msg:DynamicMapState"),
        ("map_features", 8, _REP, "msg:MapFeature"),
        ("current_time_index", 10, _OPT, "int32"),
        ("tracks_to_predict", 11, _REP, "msg:RequiredPrediction")])
    return f


def _build():
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_map_file())
    pool.Add(_scenario_file())
    names = ["MapPoint", "TrafficSignalLaneState", "RoadLine", "BoundarySegment",
             "LaneNeighbor", "LaneCenter", "RoadEdge", "StopSign", "Crosswalk", "SpeedBump",
             "Driveway", "MapFeature", "ObjectState", "Track", "DynamicMapState",
             "RequiredPrediction", "Scenario"]
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{n}"))
            for n in names}


_CLASSES = _build()
MapPoint = _CLASSES["MapPoint"]
TrafficSignalLaneState = _CLASSES["TrafficSignalLaneState"]
RoadLine = _CLASSES["RoadLine"]
BoundarySegment = _CLASSES["BoundarySegment"]
LaneNeighbor = _CLASSES["LaneNeighbor"]
LaneCenter = _CLASSES["LaneCenter"]
RoadEdge = _CLASSES["RoadEdge"]
StopSign = _CLASSES["StopSign"]
Crosswalk = _CLASSES["Crosswalk"]
SpeedBump = _CLASSES["SpeedBump"]
Driveway = _CLASSES["Driveway"]
MapFeature = _CLASSES["MapFeature"]
ObjectState = _CLASSES["ObjectState"]
Track = _CLASSES["Track"]
DynamicMapState = _CLASSES["DynamicMapState"]
RequiredPrediction = _CLASSES["RequiredPrediction"]
Scenario = _CLASSES["Scenario"]
